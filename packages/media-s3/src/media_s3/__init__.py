"""media-s3: stepcore media blobs in an S3-compatible bucket (AWS S3, Cloudflare R2, MinIO).

`S3MediaStore` is imported on first access so that loading the plugin does not import aiobotocore.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from media_s3.errors import S3AccessDeniedError, S3BucketNotFoundError, S3EndpointUnreachableError, S3MediaError
from media_s3.public_url import make_static_public_url

if TYPE_CHECKING:
    from media_s3.store import S3MediaStore

__all__ = (
    'S3AccessDeniedError',
    'S3BucketNotFoundError',
    'S3EndpointUnreachableError',
    'S3MediaError',
    'S3MediaStore',
    'make_static_public_url',
)


def __getattr__(name: str) -> Any:
    if name == 'S3MediaStore':
        from media_s3.store import S3MediaStore

        return S3MediaStore
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
