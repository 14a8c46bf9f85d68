"""`MediaStoreConformance`: the checks every `MediaStore` backend passes.

Besides the round trip, it pins the two behaviours a reader relies on when something is wrong:

- a blob that is not stored: `exists` is `False`, and `get` and `get_metadata` raise an error that
  is both a `FileNotFoundError` (pydantic-ai-harness's) and a `LookupError` (stepcore's):
  `stepcore.media.MediaNotFoundError`;
- a blob whose stored bytes were changed: `get` raises `stepcore.media.DamagedMediaError`
  (a `ValueError`) naming it, and every other blob still reads. The damage is done in the backend's
  own storage by its `media_damage` fixture; without one the test fails for a store declaring
  `persistent` and is skipped for others.
"""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeAlias

import anyio
import pytest

from stepcore import MediaContext, MediaStore
from stepcore.backend import DamagedMediaError, digest_of_uri, media_uri

from ._declared import Hook, require_hook
from .media_collection import MediaCollectionConformance
from .media_subclass import MediaSubclassConformance

__all__ = ('MediaDamage', 'MediaStoreConformance')

MediaDamage: TypeAlias = Callable[[MediaStore, str, bytes], Awaitable[None]]
"""The `media_damage` fixture's callable: `await media_damage(store, uri, replacement)` overwrites the
stored bytes of the blob at `uri` with `replacement`, in the backend's own storage."""

URI = re.compile(r'media\+sha256://[0-9a-f]{64}')


def _blob(tag: str, size: int = 256) -> bytes:
    """Distinct bytes per test and per run, so a shared bucket or database never holds them already."""
    rng = random.Random()
    return f'{tag}:'.encode() + rng.randbytes(size)


class MediaStoreConformance(MediaCollectionConformance, MediaSubclassConformance):
    """Subclass and override the `media_store` fixture (async, yields a `MediaStore` built without a
    `public_url` resolver, closed afterwards if it needs closing).

    The garbage-collection tests (`MediaCollectionConformance`) run for a store declaring the
    feature `media_collection` and skip, with the reason, for one that does not. Override
    `media_damage` too, to run the damage test."""

    @pytest.fixture
    async def media_store(self) -> AsyncIterator[MediaStore]:
        """Override this: yield the media store under test."""
        pytest.fail(
            f'{type(self).__name__} must override the `media_store` fixture: an async fixture that yields '
            'a MediaStore built without a public_url resolver (see the stepcore-conformance README)'
        )
        return  # pragma: no cover

    @pytest.fixture
    def media_damage(self) -> MediaDamage | None:
        """Override this to run the damage test: an async callable `(store, uri, replacement)` that
        overwrites the bytes stored for `uri` with `replacement` in the backend's own storage (a file,
        a row, a key, an object), leaving its metadata as it is."""
        return None

    async def test_put_returns_the_content_address(self, media_store: MediaStore) -> None:
        data = _blob('address')
        uri = await media_store.put(data)
        assert URI.fullmatch(uri), f'{uri!r} is not media+sha256://<64 lowercase hex>'
        assert uri == media_uri(data)

    async def test_put_get_exists_round_trip(self, media_store: MediaStore) -> None:
        data = _blob('round-trip') + bytes(range(256))
        uri = await media_store.put(data, context=MediaContext(media_type='application/octet-stream'))
        assert await media_store.get(uri) == data
        assert await media_store.exists(uri) is True

    async def test_missing_blob(self, media_store: MediaStore) -> None:
        uri = media_uri(_blob('never stored'))
        assert await media_store.exists(uri) is False
        with pytest.raises(LookupError):
            await media_store.get(uri)

    async def test_get_of_a_missing_blob_is_file_not_found(self, media_store: MediaStore) -> None:
        uri = media_uri(_blob('never stored'))
        with pytest.raises(FileNotFoundError) as raised:
            await media_store.get(uri)
        _check_not_found(raised.value, uri, 'get')

    async def test_metadata_of_a_missing_blob_is_file_not_found(self, media_store: MediaStore) -> None:
        uri = media_uri(_blob('never stored'))
        with pytest.raises(FileNotFoundError) as raised:
            await media_store.get_metadata(uri)
        _check_not_found(raised.value, uri, 'get_metadata')
        stored = await media_store.put(_blob('stored beside'), context=MediaContext(metadata={'k': 'v'}))
        with pytest.raises(FileNotFoundError):
            await media_store.get_metadata(uri)
        assert dict(await media_store.get_metadata(stored) or {}) == {'k': 'v'}

    async def test_damaged_blob_is_reported(self, media_store: MediaStore, media_damage: MediaDamage | None) -> None:
        damage = require_hook(media_damage, media_store, self, MEDIA_DAMAGE_HOOK)
        data, intact = _blob('damaged', 4096), _blob('intact', 4096)
        uri = await media_store.put(data, context=MediaContext(metadata={'state': 'whole'}))
        other = await media_store.put(intact)
        flipped = bytearray(data)
        flipped[len(flipped) // 2] ^= 0x01
        for replacement in (bytes(flipped), data[: len(data) // 2], b''):
            await damage(media_store, uri, replacement)
            with pytest.raises(DamagedMediaError) as raised:
                await media_store.get(uri)
            error = raised.value
            assert isinstance(error, ValueError)
            assert error.uri == uri, f'DamagedMediaError.uri is {error.uri!r}, not {uri!r}'
            assert error.kind == 'unparsable', f'DamagedMediaError.kind is {error.kind!r}, not unparsable'
            assert digest_of_uri(uri) in str(error), f'the error does not name the blob {uri}: {error}'
            assert await media_store.exists(uri) is True
        assert await media_store.get(other) == intact, 'a blob that was not damaged must still read'
        assert dict(await media_store.get_metadata(uri) or {}) == {'state': 'whole'}

    async def test_malformed_uri_is_a_value_error(self, media_store: MediaStore) -> None:
        for uri in ('https://example.org/x.png', 'media+sha256://not-a-digest', 'media+sha256://' + 'A' * 64):
            with pytest.raises(ValueError, match='media'):
                await media_store.get(uri)

    async def test_same_bytes_same_uri(self, media_store: MediaStore) -> None:
        data = _blob('dedup')
        first = await media_store.put(data)
        second = await media_store.put(bytes(data), context=MediaContext(media_type='image/png', filename='a.png'))
        assert first == second
        assert await media_store.get(first) == data
        other = await media_store.put(data + b'!')
        assert other != first

    async def test_context_does_not_change_the_address(self, media_store: MediaStore) -> None:
        data = _blob('context')
        uri = await media_store.put(data, context=MediaContext(media_type='image/png', filename='photo.png'))
        assert uri == media_uri(data)
        assert await media_store.get(uri) == data
        assert await media_store.exists(uri)

    async def test_empty_blob(self, media_store: MediaStore) -> None:
        uri = await media_store.put(b'')
        assert uri == media_uri(b'')
        assert await media_store.get(uri) == b''
        assert await media_store.exists(uri)

    async def test_one_mebibyte_blob(self, media_store: MediaStore) -> None:
        data = _blob('big', 1024 * 1024)
        uri = await media_store.put(data)
        assert uri == media_uri(data)
        assert await media_store.get(uri) == data

    async def test_public_url_is_none_without_a_resolver(self, media_store: MediaStore) -> None:
        uri = await media_store.put(_blob('url'))
        assert await media_store.public_url(uri) is None

    async def test_metadata_is_none_when_stored_without(self, media_store: MediaStore) -> None:
        uri = await media_store.put(_blob('no metadata'), context=MediaContext(media_type='text/plain'))
        assert await media_store.get_metadata(uri) is None

    async def test_metadata_round_trips(self, media_store: MediaStore) -> None:
        metadata = {'source': 'crawler', 'run-id': 'run-42', 'empty': ''}
        uri = await media_store.put(
            _blob('metadata'), context=MediaContext(media_type='image/png', filename='a.png', metadata=metadata)
        )
        got = await media_store.get_metadata(uri)
        assert got is not None
        assert dict(got) == metadata

    async def test_concurrent_puts_of_one_blob(self, media_store: MediaStore) -> None:
        data = _blob('same', 64 * 1024)
        uris: list[str] = []

        async def put() -> None:
            uris.append(await media_store.put(data))

        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(put)
        assert uris == [media_uri(data)] * 10
        assert await media_store.get(uris[0]) == data

    async def test_concurrent_puts_of_many_blobs(self, media_store: MediaStore) -> None:
        blobs = [_blob(f'many-{n}', 4096) for n in range(10)]
        stored: dict[str, bytes] = {}

        async def put(data: bytes) -> None:
            stored[await media_store.put(data)] = data

        async with anyio.create_task_group() as tg:
            for data in blobs:
                tg.start_soon(put, data)
        assert len(stored) == len(blobs)
        for uri, data in stored.items():
            assert await media_store.get(uri) == data


def _check_not_found(error: BaseException, uri: str, method: str) -> None:
    assert isinstance(error, LookupError), (
        f'{method} of a missing blob raised {type(error).__name__}, a FileNotFoundError but not a LookupError: '
        'raise stepcore.media.MediaNotFoundError (both)'
    )
    assert digest_of_uri(uri) in str(error), f'{method} of a missing blob does not name it ({uri}): {error}'


MEDIA_DAMAGE_HOOK = Hook(
    fixture='media_damage',
    does="(store, uri, replacement) overwrites a blob's bytes",
    see='MediaStoreConformance.media_damage',
    needs='the damage test needs one to damage a blob',
)
