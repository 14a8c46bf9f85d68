"""`InMemoryMediaStore`: a process-local `MediaStore` the kit hands to stores under test.

Passing it as `media_store=` lets the kit see which payloads a step store externalized. It is
`stepcore.media.MediaEngine` over a blob port in a dict, like every media store, and passes
`MediaStoreConformance` itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import ClassVar

from stepcore.backend import (
    MEDIA_COLLECTION,
    BlobHead,
    BlobMeta,
    BlobPort,
    BlobRef,
    ListedBlob,
    MediaEngine,
    PublicUrlResolver,
    from_micros,
    micros,
    uri_of_digest,
)

__all__ = ('InMemoryMediaStore',)


class _MemoryBlobs(BlobPort):
    """Blobs in a dict keyed by digest; metadata kept when given; each blob's last put time, for collection."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.stored_us: dict[str, int] = {}
        self.metadata: dict[str, str] = {}
        self.puts = 0

    def where(self) -> str:
        return 'process memory'

    async def put(self, ref: BlobRef, data: bytes, meta: BlobMeta, stored_us: int) -> None:
        self.puts += 1
        self.data.setdefault(ref.digest, data)
        self.stored_us[ref.digest] = stored_us
        if meta.text is not None:
            self.metadata[ref.digest] = meta.text

    async def get(self, ref: BlobRef) -> bytes | None:
        return self.data.get(ref.digest)

    async def head(self, ref: BlobRef) -> BlobHead | None:
        return BlobHead(metadata=self.metadata.get(ref.digest)) if ref.digest in self.data else None

    async def list(self) -> AsyncIterator[ListedBlob]:
        for digest, data in list(self.data.items()):
            yield ListedBlob(digest=digest, stored_at=from_micros(self.stored_us[digest]), size=len(data))

    async def delete(self, ref: BlobRef, location: object, older_than: datetime | None) -> bool:
        digest = ref.digest
        if digest not in self.data or (older_than is not None and self.stored_us[digest] >= micros(older_than)):
            return False
        del self.data[digest], self.stored_us[digest]
        self.metadata.pop(digest, None)
        return True


class InMemoryMediaStore(MediaEngine):
    """Blobs in process memory, for the kit's externalization and media sections."""

    features: ClassVar[frozenset[str]] = frozenset({MEDIA_COLLECTION})

    def __init__(self, *, public_url: PublicUrlResolver | None = None) -> None:
        self.__blobs = _MemoryBlobs()
        super().__init__(self.__blobs, public_url=public_url)

    @property
    def puts(self) -> int:
        """How many `put` calls were made (dedup keeps one blob per content)."""
        return self.__blobs.puts

    @property
    def blobs(self) -> dict[str, bytes]:
        """A copy of the stored blobs by URI."""
        return {uri_of_digest(digest): data for digest, data in self.__blobs.data.items()}

    def damage(self, uri: str, replacement: bytes) -> None:
        """Overwrite a stored blob's bytes (for the kit's damage tests)."""
        self.__blobs.data[BlobRef.of(uri).digest] = replacement
