"""The typed slice of the aiobotocore S3 client that `S3MediaStore` uses (aiobotocore ships no types)."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ('S3Client',)


class S3Client(Protocol):
    """An open aiobotocore S3 client; `S3MediaStore.client()` returns one.

    Every operation takes botocore's keyword parameters (`Bucket=`, `Key=`, ...) and returns the
    parsed response as a dict. `meta.events` is botocore's event system, e.g. for request hooks.
    """

    @property
    def meta(self) -> Any: ...

    async def head_bucket(self, **kwargs: Any) -> dict[str, Any]: ...

    async def head_object(self, **kwargs: Any) -> dict[str, Any]: ...

    async def get_object(self, **kwargs: Any) -> dict[str, Any]: ...

    async def put_object(self, **kwargs: Any) -> dict[str, Any]: ...

    async def create_multipart_upload(self, **kwargs: Any) -> dict[str, Any]: ...

    async def upload_part(self, **kwargs: Any) -> dict[str, Any]: ...

    async def complete_multipart_upload(self, **kwargs: Any) -> dict[str, Any]: ...

    async def abort_multipart_upload(self, **kwargs: Any) -> dict[str, Any]: ...

    async def copy_object(self, **kwargs: Any) -> dict[str, Any]: ...

    async def list_objects_v2(self, **kwargs: Any) -> dict[str, Any]: ...

    async def delete_object(self, **kwargs: Any) -> dict[str, Any]: ...

    async def generate_presigned_url(
        self,
        ClientMethod: str,
        Params: dict[str, Any] | None = None,
        ExpiresIn: int = 3600,
        HttpMethod: str | None = None,
    ) -> str: ...
