"""The blob port: the I/O a media backend implements, and the small values it deals in.

A backend subclasses `stepcore.media.blobs.MediaEngine` and implements five coroutines, one per
storage operation, plus `_blob_where` for messages. They move bytes and metadata and nothing else:
the engine computes addresses, checks the digest of every read, encodes metadata, resolves public
URLs, raises the missing-blob and damage errors and keeps the collection bookkeeping.

- `_blob_put(ref, data, meta, stored_us)`: store `data` under `ref` unless a blob is already there,
  and either way make `stored_us` (microseconds since the epoch, or the service's own clock) the
  time it was last put. Concurrent puts of one blob must not fail or store it half.
- `_blob_get(ref)`: the stored bytes, `None` when there is no blob. No checking: the engine does it.
- `_blob_head(ref)`: `BlobHead` with the stored metadata, `None` when there is no blob.
  (`_blob_exists(ref)` asks it, unless a port overrides it to tell without the metadata.)
- `_blob_list()`: every stored blob as a `ListedBlob`, read in pages.
- `_blob_delete(ref, location, older_than)`: remove the blob (and its metadata), with `older_than`
  only while it was last put before then, in a way a concurrent put cannot lose its blob to;
  whether one was removed. `location` is what `_blob_list` said about it, `None` when not listed.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from stepcore.media.metadata import RawMetadata
from stepcore.media.protocol import EMPTY_CONTEXT, KeyStrategy, MediaContext, digest_of_uri

__all__ = (
    'BlobHead',
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
    """What `_blob_head` found: the blob is stored, with this metadata (`None`: stored without any)."""

    metadata: RawMetadata = None


@dataclass(frozen=True, slots=True)
class ListedBlob:
    """One stored blob as `_blob_list` yields it."""

    digest: str
    stored_at: datetime
    """When it was last put, an aware datetime."""
    size: int
    location: object = None
    """Where the port found it (a path, an object key), handed back to `_blob_delete`."""


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
