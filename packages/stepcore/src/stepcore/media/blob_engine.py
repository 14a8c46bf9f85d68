"""`MediaEngine`: the `MediaStore` contract written once, over a backend's blob port (`BlobPort`)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import ClassVar

from stepcore.common.features import MEDIA_COLLECTION
from stepcore.media.blob_port import BlobPort, BlobRef, now_micros
from stepcore.media.errors import DamagedMediaError, MediaNotFoundError
from stepcore.media.metadata import BlobMeta, decode_metadata
from stepcore.media.protocol import (
    EMPTY_CONTEXT,
    MediaContext,
    PublicUrlResolver,
    StoredMedia,
    media_uri,
    resolve_public_url,
    uri_of_digest,
)

__all__ = ('MediaEngine',)


class MediaEngine:
    """A `MediaStore` (and a `CollectableMediaStore`) on a backend's blob port.

    A backend subclasses it, builds its port (a `BlobPort`, which only does I/O) and calls
    `super().__init__(port, public_url=...)`. Written here, the same for every backend:

    - addresses: `put` returns `media+sha256://<sha256 of the bytes>`; a malformed address is a
      `ValueError` before any I/O;
    - a missing blob: `get` and `get_metadata` raise `MediaNotFoundError` (a `FileNotFoundError` and
      a `LookupError`), `exists` is `False`;
    - damage: every `get` hashes the bytes it read, and bytes that are not the blob's raise
      `DamagedMediaError` (a `ValueError`) naming the blob and the store;
    - metadata: `context.metadata` must map strings to strings and is kept only when not empty;
      `get_metadata` is `None` for a blob stored without any;
    - `public_url`: the configured resolver (sync or async), else `None`;
    - collection: every `put` marks the blob put now; `list_media` and `delete_media` follow
      `stepcore.media.CollectableMediaStore`.

    The engine and its backends keep their own state in name-mangled attributes (`self.__port`), so
    a user's subclass may set any single-underscore name of its own.
    """

    features: ClassVar[frozenset[str]] = frozenset({MEDIA_COLLECTION})

    def __init__(self, port: BlobPort, *, public_url: PublicUrlResolver | None = None) -> None:
        self.__port = port
        self.public_url_resolver = public_url
        """The `public_url=` resolver: `(uri, context) -> url | None`, sync or async."""
        self.__listed: dict[str, object] = {}
        """Where `list_media` found each blob (a key strategy may use a context `delete_media` lacks)."""

    @property
    def port(self) -> BlobPort:
        """The blob port the store's I/O goes to."""
        return self.__port

    # -- MediaStore -----------------------------------------------------------------------------------

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        """Store `data` once per content and return its `media+sha256://<hex>` URI."""
        data = bytes(data)
        meta = BlobMeta.of(context)
        ref = BlobRef.of(media_uri(data), context)
        await self.__port.put(ref, data, meta, now_micros())
        return ref.uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        """The blob's bytes; `MediaNotFoundError` when absent, `DamagedMediaError` when they are not its bytes."""
        ref = BlobRef.of(uri, context)
        data = await self.__port.get(ref)
        if data is None:
            raise MediaNotFoundError(uri, self.__port.where())
        actual = hashlib.sha256(data).hexdigest()
        if actual != ref.digest:
            raise DamagedMediaError(
                uri=uri,
                where=self.__port.where(),
                reason=(
                    f'its {len(data)} stored bytes have sha256 {actual}, not the digest its address names '
                    '(they were changed outside the store, or a key_strategy maps two blobs to one key): '
                    'restore it from a backup, or delete it (delete_media) and put the original bytes again'
                ),
            )
        return data

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        """Whether a blob is stored at `uri` (its bytes are not read, so not checked)."""
        return await self.__port.exists(BlobRef.of(uri, context))

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        """The configured resolver's URL for `uri`, or `None` without a resolver."""
        return await resolve_public_url(self.public_url_resolver, BlobRef.of(uri, context).uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str] | None:
        """The metadata stored with the blob, `None` when it was stored without any; `MediaNotFoundError`
        when there is no blob."""
        ref = BlobRef.of(uri, context)
        head = await self.__port.head(ref)
        if head is None:
            raise MediaNotFoundError(uri, self.__port.where())
        try:
            return decode_metadata(head.metadata)
        except ValueError as error:
            raise DamagedMediaError(uri=uri, where=self.__port.where(), reason=str(error)) from None

    # -- garbage collection ---------------------------------------------------------------------------

    async def list_media(self) -> AsyncIterator[StoredMedia]:
        """Every stored blob, with when it was last put, read in pages."""
        async for blob in self.__port.list():
            uri = uri_of_digest(blob.digest)  # checked: a port lists names it may not have written
            if blob.location is not None:
                self.__listed[uri] = blob.location
            yield StoredMedia(uri=uri, stored_at=blob.stored_at, size=blob.size)

    async def delete_media(self, uri: str, *, older_than: datetime | None = None) -> bool:
        """Remove the blob at `uri`; with `older_than`, only while it was last put before then."""
        ref = BlobRef.of(uri)
        removed = await self.__port.delete(ref, self.__listed.get(uri), older_than)
        if removed:
            self.__listed.pop(uri, None)
        return removed

    # -- lifecycle ------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release what the store opened (its port's connection or client); a given one stays open."""
        await self.__port.aclose()
