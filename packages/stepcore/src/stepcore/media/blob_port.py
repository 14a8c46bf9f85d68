"""The blob port: the I/O a media backend implements (`BlobPort`), and the small values it deals in."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from stepcore.media.metadata import BlobMeta, RawMetadata
from stepcore.media.protocol import EMPTY_CONTEXT, KeyStrategy, MediaContext, digest_of_uri

__all__ = (
    'BlobHead',
    'BlobPort',
    'BlobRef',
    'ListedBlob',
    'digest_in_name',
    'from_micros',
    'micros',
    'now_micros',
    'strategy_key',
)

_DIGEST = re.compile(r'[0-9a-f]{64}')


@dataclass(frozen=True, slots=True)
class BlobRef:
    """The blob an operation is about: its address, the address's digest, and the caller's context."""

    uri: str
    digest: str
    context: MediaContext = EMPTY_CONTEXT

    @classmethod
    def of(cls, uri: str, context: MediaContext = EMPTY_CONTEXT) -> BlobRef:
        """`ValueError` for anything but a `media+sha256://<64 lowercase hex>` address."""
        return cls(uri=uri, digest=digest_of_uri(uri), context=context)


@dataclass(frozen=True, slots=True)
class BlobHead:
    """What `BlobPort.head` found: the blob is stored, with this metadata (`None`: stored without any)."""

    metadata: RawMetadata = None


@dataclass(frozen=True, slots=True)
class ListedBlob:
    """One stored blob as `BlobPort.list` yields it."""

    digest: str
    stored_at: datetime
    """When it was last put, an aware datetime."""
    size: int
    location: object = None
    """Where the port found it (a path, an object key), handed back to `BlobPort.delete`."""


def now_micros() -> int:
    """The time of a put, in microseconds since the epoch."""
    return time.time_ns() // 1000


def micros(moment: datetime) -> int:
    """An aware datetime in microseconds since the epoch."""
    return int(moment.timestamp() * 1_000_000)


def from_micros(value: int | float | None) -> datetime:
    """Microseconds since the epoch as an aware UTC datetime; `None` (a blob stored before its time
    was kept) counts as put at the epoch, long ago."""
    return datetime.fromtimestamp((value or 0) / 1_000_000, UTC)


def digest_in_name(name: str) -> str | None:
    """The sha256 digest a stored name (a file name, an object key) holds, `None` unless exactly one."""
    found = _DIGEST.findall(name)
    return found[0] if len(found) == 1 else None


def strategy_key(strategy: KeyStrategy, ref: BlobRef) -> str:
    """`strategy(uri, context)`, checked to be a non-empty string."""
    key = cast(object, strategy(ref.uri, ref.context))
    if not isinstance(key, str) or not key:
        raise ValueError(f'key_strategy returned {key!r} for {ref.uri!r}: it must return a non-empty relative key')
    return key


class BlobPort:
    """The I/O a media backend implements: the media engine (`MediaEngine`) is given one and asks it.

    A backend subclasses it, holding what its I/O needs (a connection, a client, a directory), and
    its media store calls `MediaEngine.__init__(self, port, public_url=...)`. The port implements
    five coroutines, one per storage operation, plus `where` for messages. They move bytes and
    metadata and nothing else: the engine computes addresses, checks the digest of every read,
    encodes metadata, resolves public URLs, raises the missing-blob and damage errors and keeps the
    collection bookkeeping.

    - `put(ref, data, meta, stored_us)`: store `data` under `ref` unless a blob is already there,
      and either way make `stored_us` (microseconds since the epoch, or the service's own clock)
      the time it was last put. Concurrent puts of one blob must not fail or store it half.
    - `get(ref)`: the stored bytes, `None` when there is no blob. No checking: the engine does it.
    - `head(ref)`: `BlobHead` with the stored metadata, `None` when there is no blob. (`exists(ref)`
      asks it, unless a port overrides it to tell without the metadata.)
    - `list()`: every stored blob as a `ListedBlob`, read in pages.
    - `delete(ref, location, older_than)`: remove the blob (and its metadata), with `older_than`
      only while it was last put before then, in a way a concurrent put cannot lose its blob to;
      whether one was removed. `location` is what `list` said about it, `None` when not listed.
    - `aclose()`: release what the port opened (the media store's `aclose` calls it); nothing by default.
    """

    def where(self) -> str:
        """Where the blobs live, for messages (`"table 'media' of database runs.db"`)."""
        return type(self).__name__

    async def put(self, ref: BlobRef, data: bytes, meta: BlobMeta, stored_us: int) -> None:
        raise NotImplementedError(f'{type(self).__name__} does not implement put')

    async def get(self, ref: BlobRef) -> bytes | None:
        raise NotImplementedError(f'{type(self).__name__} does not implement get')

    async def head(self, ref: BlobRef) -> BlobHead | None:
        raise NotImplementedError(f'{type(self).__name__} does not implement head')

    async def exists(self, ref: BlobRef) -> bool:
        """Whether a blob is stored; a port overrides it when it can tell without reading the metadata."""
        return await self.head(ref) is not None

    def list(self) -> AsyncIterator[ListedBlob]:
        raise NotImplementedError(f'{type(self).__name__} does not implement list')

    async def delete(self, ref: BlobRef, location: object, older_than: datetime | None) -> bool:
        raise NotImplementedError(f'{type(self).__name__} does not implement delete')

    async def aclose(self) -> None:
        """Release what the port opened; a connection or client it was given stays open."""
