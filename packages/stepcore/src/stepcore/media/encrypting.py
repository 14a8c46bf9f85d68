"""`EncryptingMediaStore`: a media store whose blobs are kept encrypted in another one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepcore.common.encryption import Encryption

__all__ = ('EncryptingMediaStore',)


class EncryptingMediaStore:
    """A `MediaStore` that keeps its blobs encrypted in another one (the engine wraps a store's
    media store in it when the store is given `encryption=`).

    A blob is encrypted deterministically (its nonce derived from a keyed hash of its content), so
    one content still makes one blob and one `media+sha256://` address, the address of the
    ciphertext: the content's own hash is never stored. Encrypted blobs have no public URL.
    """

    def __init__(self, inner: Any, encryption: Encryption) -> None:
        self.inner = inner
        self.encryption = encryption

    def __repr__(self) -> str:
        return f'EncryptingMediaStore({self.inner!r}, {self.encryption!r})'

    def seal(self, data: bytes) -> bytes:
        """`data` as stored (see `Encryption.seal_blob`)."""
        return self.encryption.seal_blob(data)

    def open(self, blob: bytes, uri: str = 'a media blob') -> bytes:
        """The content of a stored blob; a blob stored without encryption is returned as it is."""
        return self.encryption.open_blob(blob, what=f'media blob {uri}')

    async def put(self, data: bytes, *, context: Any = None) -> str:
        if context is None:
            return await self.inner.put(self.seal(data))
        return await self.inner.put(self.seal(data), context=context)

    async def get(self, uri: str, *, context: Any = None) -> bytes:
        blob = await (self.inner.get(uri) if context is None else self.inner.get(uri, context=context))
        return self.open(blob, repr(uri))

    async def exists(self, uri: str, *, context: Any = None) -> bool:
        return await (self.inner.exists(uri) if context is None else self.inner.exists(uri, context=context))

    async def public_url(self, uri: str, *, context: Any = None) -> str | None:
        del uri, context
        return None

    async def get_metadata(self, uri: str, *, context: Any = None) -> Mapping[str, str] | None:
        if context is None:
            return await self.inner.get_metadata(uri)
        return await self.inner.get_metadata(uri, context=context)
