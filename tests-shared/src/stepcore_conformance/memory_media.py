"""`InMemoryMediaStore`: a process-local `MediaStore` the kit hands to stores under test.

Passing it as `media_store=` lets the kit see which payloads a step store externalized. It is a
complete implementation of the protocol and passes `MediaStoreConformance` itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import ClassVar

from stepcore.features import MEDIA_COLLECTION
from stepcore.media import (
    EMPTY_CONTEXT,
    MediaContext,
    MediaStore,
    PublicUrlResolver,
    StoredMedia,
    digest_of_uri,
    media_uri,
    resolve_public_url,
    uri_of_digest,
)
from stepcore.models import utcnow

__all__ = ('InMemoryMediaStore',)


class InMemoryMediaStore(MediaStore):
    """Blobs in a dict keyed by digest; metadata kept when given; each blob's last put time, for collection."""

    features: ClassVar[frozenset[str]] = frozenset({MEDIA_COLLECTION})

    def __init__(self, *, public_url: PublicUrlResolver | None = None) -> None:
        self._blobs: dict[str, bytes] = {}
        self._stored_at: dict[str, datetime] = {}
        self._metadata: dict[str, dict[str, str]] = {}
        self._public_url = public_url
        self.puts = 0
        """How many `put` calls were made (dedup keeps one blob per content)."""

    @property
    def blobs(self) -> dict[str, bytes]:
        """A copy of the stored blobs by URI."""
        return {f'media+sha256://{digest}': data for digest, data in self._blobs.items()}

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        uri = media_uri(data)
        digest = digest_of_uri(uri)
        self.puts += 1
        self._blobs.setdefault(digest, bytes(data))
        self._stored_at[digest] = utcnow()
        if context.metadata:
            self._metadata[digest] = dict(context.metadata)
        return uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        digest = digest_of_uri(uri)
        try:
            return self._blobs[digest]
        except KeyError:
            raise LookupError(f'no media stored at {uri!r}') from None

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        return digest_of_uri(uri) in self._blobs

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        digest_of_uri(uri)
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str] | None:
        digest = digest_of_uri(uri)
        if digest not in self._blobs:
            raise LookupError(f'no media stored at {uri!r}')
        metadata = self._metadata.get(digest)
        return dict(metadata) if metadata is not None else None

    async def list_media(self) -> AsyncIterator[StoredMedia]:
        for digest, data in list(self._blobs.items()):
            yield StoredMedia(uri=uri_of_digest(digest), stored_at=self._stored_at[digest], size=len(data))

    async def delete_media(self, uri: str, *, older_than: datetime | None = None) -> bool:
        digest = digest_of_uri(uri)
        if digest not in self._blobs or (older_than is not None and self._stored_at[digest] >= older_than):
            return False
        del self._blobs[digest], self._stored_at[digest]
        self._metadata.pop(digest, None)
        return True
