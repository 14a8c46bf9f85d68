"""`InMemoryMediaStore`: a process-local `MediaStore` the kit hands to stores under test.

Passing it as `media_store=` lets the kit see which payloads a step store externalized. It is a
blob port on `stepcore.media.blobs.MediaEngine` like every media store, and passes
`MediaStoreConformance` itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import ClassVar

from stepcore.common.features import MEDIA_COLLECTION
from stepcore.media import PublicUrlResolver, uri_of_digest
from stepcore.media.blobs import BlobHead, BlobMeta, BlobRef, ListedBlob, MediaEngine, from_micros, micros

__all__ = ('InMemoryMediaStore',)


class InMemoryMediaStore(MediaEngine):
    """Blobs in a dict keyed by digest; metadata kept when given; each blob's last put time, for collection."""

    features: ClassVar[frozenset[str]] = frozenset({MEDIA_COLLECTION})

    def __init__(self, *, public_url: PublicUrlResolver | None = None) -> None:
        super().__init__(public_url=public_url)
        self._blobs: dict[str, bytes] = {}
        self._stored_us: dict[str, int] = {}
        self._metadata: dict[str, str] = {}
        self.puts = 0
        """How many `put` calls were made (dedup keeps one blob per content)."""

    @property
    def blobs(self) -> dict[str, bytes]:
        """A copy of the stored blobs by URI."""
        return {uri_of_digest(digest): data for digest, data in self._blobs.items()}

    def damage(self, uri: str, replacement: bytes) -> None:
        """Overwrite a stored blob's bytes (for the kit's damage tests)."""
        self._blobs[BlobRef.of(uri).digest] = replacement

    def _blob_where(self) -> str:
        return 'process memory'

    async def _blob_put(self, ref: BlobRef, data: bytes, meta: BlobMeta, stored_us: int) -> None:
        self.puts += 1
        self._blobs.setdefault(ref.digest, data)
        self._stored_us[ref.digest] = stored_us
        if meta.text is not None:
            self._metadata[ref.digest] = meta.text

    async def _blob_get(self, ref: BlobRef) -> bytes | None:
        return self._blobs.get(ref.digest)

    async def _blob_head(self, ref: BlobRef) -> BlobHead | None:
        return BlobHead(metadata=self._metadata.get(ref.digest)) if ref.digest in self._blobs else None

    async def _blob_list(self) -> AsyncIterator[ListedBlob]:
        for digest, data in list(self._blobs.items()):
            yield ListedBlob(digest=digest, stored_at=from_micros(self._stored_us[digest]), size=len(data))

    async def _blob_delete(self, ref: BlobRef, location: object, older_than: datetime | None) -> bool:
        digest = ref.digest
        if digest not in self._blobs or (older_than is not None and self._stored_us[digest] >= micros(older_than)):
            return False
        del self._blobs[digest], self._stored_us[digest]
        self._metadata.pop(digest, None)
        return True
