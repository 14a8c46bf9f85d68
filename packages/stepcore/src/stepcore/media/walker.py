"""Media externalization: large payloads leave the stored message JSON for a `MediaStore`.

`BinaryContent.data` of at least the threshold (decoded bytes) and any other string at or above it
(UTF-8 bytes) are replaced by a marker holding a `media+sha256://<hex>` URI; `restore` puts the
original values back. Binary content below the threshold stays inline, base64 and all. A payload
that itself uses one of the marker's reserved keys is escaped on the way out and restored on the
way back, so user data can never be mistaken for a marker.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from typing import Any, cast

from stepcore.media.protocol import EMPTY_CONTEXT, MediaContext, MediaStore, media_uri

__all__ = (
    'DEFAULT_MEDIA_THRESHOLD_BYTES',
    'ESCAPED_KEY',
    'MARKER_FORMAT',
    'MARKER_FORMAT_KEY',
    'MARKER_KEY',
    'MediaWalker',
    'payload_addresses',
    'stored_references',
)

DEFAULT_MEDIA_THRESHOLD_BYTES = 64 * 1024

MARKER_KEY = '__stepcore_media__'
"""Marker dict key holding the `media+sha256://` URI."""
MARKER_FORMAT_KEY = '__stepcore_marker_format__'
"""Version stamp on markers and on escaped payloads."""
ESCAPED_KEY = '__stepcore_escaped__'
"""Holds a payload's own values for reserved keys, moved out of the way."""
ENCODING_KEY = 'encoding'
MARKER_FORMAT = 1
RESERVED_KEYS = frozenset({MARKER_KEY, MARKER_FORMAT_KEY, ESCAPED_KEY})
_RESERVED_PREFIX = b'__stepcore_'
_TEXT_MEDIA_TYPE = 'text/plain; charset=utf-8'


def _check_marker_format(value: dict[str, Any]) -> None:
    version = value.get(MARKER_FORMAT_KEY)
    if type(version) is not int or version != MARKER_FORMAT:
        raise ValueError(
            f'stored media marker has format {version!r}, which this stepcore does not read '
            f'(it reads format {MARKER_FORMAT}): upgrade stepcore to restore this snapshot'
        )


def _decode_base64(text: str) -> tuple[bytes, str] | None:
    """The bytes of a canonical base64 string and its alphabet, or `None` for any other string.

    pydantic writes bytes as URL-safe base64; a standard-alphabet payload (user data shaped like
    binary content) is accepted too. Only a string that re-encodes to itself is externalized, so
    restoring always gives back the exact original text.
    """
    if not text.isascii():
        return None
    raw = text.encode('ascii')
    try:
        data = base64.urlsafe_b64decode(raw)
        if base64.urlsafe_b64encode(data) == raw:
            return data, 'base64url'
        data = base64.b64decode(raw, validate=True)
    except ValueError:  # binascii.Error
        return None
    if base64.b64encode(data) == raw:
        return data, 'base64'
    return None


class MediaWalker:
    """Externalizes and restores media inside JSON-compatible message data.

    With `media_store=None` nothing is externalized, but reserved keys are still escaped so that
    restoring is always exact.
    """

    def __init__(self, media_store: MediaStore | None, threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES) -> None:
        if isinstance(threshold_bytes, bool) or not isinstance(threshold_bytes, int) or threshold_bytes < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'media_threshold_bytes={threshold_bytes!r} must be a positive integer number of bytes')
        self.media_store = media_store
        self.threshold_bytes = threshold_bytes

    # -- whole encoded messages -------------------------------------------------------------

    def needs_walk(self, encoded: bytes) -> bool:
        """Whether `externalize` would change this encoded message (media to move out, keys to escape)."""
        if _RESERVED_PREFIX in encoded:
            return True
        if self.media_store is None:
            return False
        # A payload at or above the threshold (binary content's base64 is longer than its bytes)
        # makes the encoded message at least as long.
        return len(encoded) >= self.threshold_bytes

    def any_needs_walk(self, messages: Sequence[bytes]) -> bool:
        """Whether `needs_walk` holds for one of these encoded messages (at every save: a loop, not
        `any` over a generator, which would cost a frame more)."""
        for encoded in messages:  # noqa: SIM110
            if self.needs_walk(encoded):
                return True
        return False

    async def externalize(self, encoded: bytes) -> bytes:
        """The stored form of one encoded message (compact JSON bytes)."""
        if not self.needs_walk(encoded):
            return encoded
        value = await self.externalize_value(json.loads(encoded))
        return json.dumps(value, separators=(',', ':'), ensure_ascii=False).encode()

    async def restore(self, stored: bytes) -> bytes:
        """The encoded message back from its stored form."""
        if _RESERVED_PREFIX not in stored:
            return stored
        value = await self.restore_value(json.loads(stored))
        return json.dumps(value, separators=(',', ':'), ensure_ascii=False).encode()

    # -- JSON values ------------------------------------------------------------------------

    async def externalize_value(self, value: Any) -> Any:
        """`value` with media externalized and reserved keys escaped (a new structure)."""
        if isinstance(value, str):
            return await self._externalize_text(value)
        if isinstance(value, list):
            return [await self.externalize_value(v) for v in cast(list[Any], value)]
        if isinstance(value, dict):
            return await self._externalize_dict(cast(dict[str, Any], value))
        return value

    async def _externalize_text(self, text: str) -> Any:
        store = self.media_store
        if store is None or len(text) * 4 < self.threshold_bytes:
            return text
        data = text.encode()
        if len(data) < self.threshold_bytes:
            return text
        uri = await store.put(data, context=MediaContext(media_type=_TEXT_MEDIA_TYPE))
        return {MARKER_KEY: uri, MARKER_FORMAT_KEY: MARKER_FORMAT, ENCODING_KEY: 'text'}

    async def _externalize_dict(self, value: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        escaped: dict[str, Any] = {}
        binary = self.media_store is not None and value.get('kind') == 'binary' and isinstance(value.get('data'), str)
        for key, item in value.items():
            if binary and key == 'data' and (decoded := _decode_base64(item)) is not None:
                data, encoding = decoded
                if len(data) >= self.threshold_bytes:
                    out[key] = await self._externalize_binary(data, encoding, value.get('media_type'))
                else:
                    out[key] = item  # below the threshold: inline, not taken for a long string either
            elif key in RESERVED_KEYS:
                escaped[key] = await self.externalize_value(item)
            else:
                out[key] = await self.externalize_value(item)
        if escaped:
            out[ESCAPED_KEY] = escaped
            out[MARKER_FORMAT_KEY] = MARKER_FORMAT
        return out

    async def _externalize_binary(self, data: bytes, encoding: str, media_type: object) -> dict[str, Any]:
        assert self.media_store is not None
        context = MediaContext(media_type=media_type if isinstance(media_type, str) else None)
        uri = await self.media_store.put(data, context=context)
        return {MARKER_KEY: uri, MARKER_FORMAT_KEY: MARKER_FORMAT, ENCODING_KEY: encoding}

    async def restore_value(self, value: Any) -> Any:
        """`value` with markers resolved and escaped keys put back (a new structure)."""
        if isinstance(value, list):
            return [await self.restore_value(v) for v in cast(list[Any], value)]
        if not isinstance(value, dict):
            return value
        mapping = cast(dict[str, Any], value)
        if MARKER_KEY in mapping:
            return await self._restore_marker(mapping)
        out: dict[str, Any] = {}
        for key, item in mapping.items():
            if key not in (ESCAPED_KEY, MARKER_FORMAT_KEY):
                out[key] = await self.restore_value(item)
        if ESCAPED_KEY in mapping or MARKER_FORMAT_KEY in mapping:
            _check_marker_format(mapping)
            escaped = mapping.get(ESCAPED_KEY)
            if not isinstance(escaped, dict):
                raise ValueError(f'stored payload has a malformed {ESCAPED_KEY!r} entry: {escaped!r}')
            for key, item in cast(dict[str, Any], escaped).items():
                out[key] = await self.restore_value(item)
        return out

    async def _restore_marker(self, marker: dict[str, Any]) -> Any:
        _check_marker_format(marker)
        uri = marker[MARKER_KEY]
        encoding = marker.get(ENCODING_KEY)
        if self.media_store is None:
            raise ValueError(f'stored snapshot references externalized media {uri!r} but the store has no media_store')
        data = await self.media_store.get(uri)
        if encoding == 'base64url':
            return base64.urlsafe_b64encode(data).decode('ascii')
        if encoding == 'base64':
            return base64.b64encode(data).decode('ascii')
        if encoding == 'text':
            return data.decode()
        raise ValueError(f'stored media marker for {uri!r} has unknown encoding {encoding!r}')


def stored_references(stored: bytes | str) -> set[str]:
    """The `media+sha256://` URIs the markers in one stored message point at, without fetching them.

    Reads markers exactly as `MediaWalker.restore` does: a payload's own values for reserved keys,
    escaped on the way in, are never taken for markers. Raises `ValueError` for a body that is not
    a JSON object or holds a marker of an unknown format.
    """
    raw = stored.encode() if isinstance(stored, str) else stored
    if not (raw.startswith(b'{') and raw.endswith(b'}')):
        # Cheap where parsing every message would not be: a body whose bytes could not be had
        # whole (cut short, or still in a backend's own packing) cannot be vouched for.
        raise ValueError('the stored message is not a JSON object (it is damaged)')
    if MARKER_KEY.encode() not in raw:
        return set()
    found: set[str] = set()
    _collect(json.loads(raw), found)
    return found


def _collect(value: Any, found: set[str]) -> None:
    if isinstance(value, list):
        for item in cast(list[Any], value):
            _collect(item, found)
        return
    if not isinstance(value, dict):
        return
    mapping = cast(dict[str, Any], value)
    if MARKER_KEY in mapping:
        _check_marker_format(mapping)
        uri = mapping[MARKER_KEY]
        if not isinstance(uri, str):
            raise ValueError(f'stored media marker holds {uri!r} where a media+sha256:// URI belongs')
        found.add(uri)
        return
    for key, item in mapping.items():
        if key == ESCAPED_KEY and isinstance(item, dict):
            for escaped in cast(dict[str, Any], item).values():
                _collect(escaped, found)
        elif key != MARKER_FORMAT_KEY:
            _collect(item, found)


class _Addresses(MediaStore):
    """A media store that stores nothing: it only notes the address of every payload offered."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        uri = media_uri(data)
        self.seen.add(uri)
        return uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        raise LookupError(uri)

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        return uri in self.seen

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return None

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> None:
        return None


async def payload_addresses(encoded_messages: Iterable[bytes]) -> set[str]:
    """The `media+sha256://` address every payload of these encoded messages has (or would have)
    in a media store, whatever its size: what a store whose threshold is not known may reference
    (counting more than it holds is safe for garbage collection)."""
    addresses = _Addresses()
    walker = MediaWalker(addresses, threshold_bytes=1)
    for message in encoded_messages:
        await walker.externalize(message)
    return addresses.seen
