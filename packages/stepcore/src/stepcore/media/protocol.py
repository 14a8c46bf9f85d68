"""The media store protocol: content-addressed blobs referenced from stored snapshots."""

from __future__ import annotations

import hashlib
import reprlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, TypeAlias, cast, runtime_checkable

__all__ = (
    'AUTO',
    'EMPTY_CONTEXT',
    'MEDIA_URI_PREFIX',
    'CollectableMediaStore',
    'KeyStrategy',
    'MediaContext',
    'MediaStore',
    'MediaStoreOption',
    'PublicUrlResolver',
    'StoredMedia',
    'check_media_store',
    'default_key',
    'digest_of_uri',
    'media_uri',
    'resolve_media_store',
    'resolve_public_url',
    'uri_of_digest',
)

MEDIA_URI_PREFIX = 'media+sha256://'


@dataclass(frozen=True, kw_only=True)
class MediaContext:
    """Per-operation details a media store may use; every field is optional."""

    media_type: str | None = None
    """The payload's media type, e.g. `image/png`."""
    filename: str | None = None
    """The original filename, when known."""
    metadata: Mapping[str, str] = field(default_factory=dict[str, str])
    """User-supplied tags, returned by `get_metadata`."""


EMPTY_CONTEXT = MediaContext()

PublicUrlResolver = Callable[[str, MediaContext], Awaitable[str | None] | str | None]
"""Turns a `media+sha256://` URI into a URL a model can fetch, or `None`."""

KeyStrategy = Callable[[str, MediaContext], str]
"""Maps a `media+sha256://` URI to the backend's storage key (a relative path or object key)."""


def media_uri(data: bytes) -> str:
    """The content address of `data`."""
    return MEDIA_URI_PREFIX + hashlib.sha256(data).hexdigest()


def digest_of_uri(uri: str) -> str:
    """The hex sha256 digest in a `media+sha256://` URI; `ValueError` for anything else."""
    if not uri.startswith(MEDIA_URI_PREFIX):
        raise ValueError(f'media URI {uri!r} is not a {MEDIA_URI_PREFIX}<sha256> address')
    digest = uri[len(MEDIA_URI_PREFIX) :]
    if len(digest) != 64 or any(c not in '0123456789abcdef' for c in digest):
        raise ValueError(f'media URI {uri!r} does not carry a 64-character lowercase hex sha256 digest')
    return digest


def uri_of_digest(digest: str) -> str:
    """The `media+sha256://` URI of a hex digest; `ValueError` for anything but 64 lowercase hex characters."""
    uri = MEDIA_URI_PREFIX + digest
    digest_of_uri(uri)
    return uri


def default_key(uri: str, context: MediaContext = EMPTY_CONTEXT) -> str:
    """The default storage key of a blob: `<sha256>.bin`."""
    del context
    return f'{digest_of_uri(uri)}.bin'


async def resolve_public_url(resolver: PublicUrlResolver | None, uri: str, context: MediaContext) -> str | None:
    """Call a sync or async `public_url` resolver; `None` when there is none."""
    if resolver is None:
        return None
    result = resolver(uri, context)
    if isinstance(result, Awaitable):
        return await result
    return result


@runtime_checkable
class MediaStore(Protocol):
    """Where externalized blobs live. Every method takes a `MediaContext`.

    The contract (every media store of stepcore keeps it through `stepcore.media.MediaEngine`,
    and `stepcore_conformance.MediaStoreConformance` checks it):

    - A URI that is not `media+sha256://<64 lowercase hex>` is a `ValueError`, before any I/O.
    - A blob that is not stored: `exists` is `False`; `get` and `get_metadata` raise
      `stepcore.media.MediaNotFoundError`, which is both a `FileNotFoundError` (what
      pydantic-ai-harness's media stores raise) and a `LookupError`.
    - A stored blob whose bytes do not hash to its address: `get` raises
      `stepcore.media.DamagedMediaError` (a `ValueError`, like every damaged record) naming
      it; other blobs still read.
    - Metadata maps strings to strings; `get_metadata` is `None` for a blob put without any.
    """

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        """Store `data` (once per content) and return its `media+sha256://<hex>` URI."""
        ...

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        """The bytes at `uri`; `MediaNotFoundError` (a `FileNotFoundError` and a `LookupError`) when
        absent, `DamagedMediaError` (a `ValueError`) when the stored bytes are not the blob's."""
        ...

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        """Whether a blob is stored at `uri`."""
        ...

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        """A URL a model can fetch for `uri`, from the configured resolver, else `None`."""
        ...

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str] | None:
        """The metadata mapping stored with the blob, `None` when it was stored without any;
        `MediaNotFoundError` when no blob is stored at `uri`."""
        ...


@dataclass(frozen=True, slots=True)
class StoredMedia:
    """One blob as a collectable media store lists it."""

    uri: str
    """Its `media+sha256://` address."""
    stored_at: datetime
    """When it was last put (an aware datetime): its first write, or a later `put` of the same bytes."""
    size: int
    """Its length in bytes."""


@runtime_checkable
class CollectableMediaStore(MediaStore, Protocol):
    """A media store whose blobs can be listed and removed: what garbage collection needs.

    A store offering it declares the feature `media_collection` (`stepcore.common.features`), and its
    `put` of bytes already stored moves the blob's `stored_at` to now: a blob about to be
    referenced by a snapshot not yet saved is then inside any grace period (see `docs/media-gc.md`).
    """

    def list_media(self) -> AsyncIterator[StoredMedia]:
        """Every stored blob, in no particular order, read in pages (never all at once)."""
        ...

    async def delete_media(self, uri: str, *, older_than: datetime | None = None) -> bool:
        """Remove the blob at `uri`; whether one was removed.

        With `older_than`, only while its `stored_at` is still before that time: a blob put again
        since it was listed stays. Removing a blob that is not there returns `False`.
        """
        ...


AUTO: Literal['auto'] = 'auto'
"""`media_store='auto'`, every step store's default: the store's own default media store."""

MediaStoreOption: TypeAlias = MediaStore | Literal['auto'] | None
"""What a step store's `media_store=` takes: `'auto'` (the store's own default media store, the
default), `None` (no media store: every payload stays inline) or a `MediaStore`."""


def check_media_store(value: object, *, owner: str) -> MediaStoreOption:
    """`value` as a `media_store=` option; `TypeError` / `ValueError` naming it when it is none of the three.

    A media store is any object (not a class) with the five methods of `MediaStore`: `put`, `get`,
    `exists`, `public_url` and `get_metadata`. `owner` names the store in the message.
    """
    if value is None or (isinstance(value, str) and value == AUTO):
        return cast(MediaStoreOption, value)
    missing = [name for name in _MEDIA_METHODS if not callable(getattr(value, name, None))]
    if not missing and not isinstance(value, type):
        return cast(MediaStore, value)
    if isinstance(value, type):
        problem = 'is a class, not a media store: pass an instance of it'
    elif isinstance(value, str):
        problem = "is not a media store: the only string it takes is 'auto'"
    else:
        problem = f'is not a media store ({type(value).__name__} has no {", ".join(missing)})'
    message = (
        f"{owner}: media_store={_SHOWN.repr(value)} {problem}. Pass {AUTO!r} (the default: the store's own "
        'media store), None (keep every payload inline) or a media store (an object with async put, get, '
        'exists, public_url and get_metadata, e.g. DiskMediaStore(path))'
    )
    raise (ValueError if isinstance(value, str) else TypeError)(message)


def resolve_media_store(value: object, *, default: Callable[[], MediaStore | None], owner: str) -> MediaStore | None:
    """The media store a step store built with `media_store=value` uses.

    `'auto'` is `default()`, the store's own default media store (`None` for a store that keeps
    every payload inline); `None` is no media store; a media store is used as it is. Anything else
    raises as `check_media_store` does, before `default` is called.
    """
    option = check_media_store(value, owner=owner)
    return default() if isinstance(option, str) else option


_MEDIA_METHODS = ('put', 'get', 'exists', 'public_url', 'get_metadata')

_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80
