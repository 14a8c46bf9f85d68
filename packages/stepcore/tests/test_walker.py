"""The media walker: externalizing, escaping and restoring JSON message data."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic_ai.messages import BinaryContent, ModelRequest, ToolReturnPart, UserPromptPart

from stepcore.media import EMPTY_CONTEXT, MediaContext, digest_of_uri, media_uri
from stepcore.media.walker import (
    DEFAULT_MEDIA_THRESHOLD_BYTES,
    ESCAPED_KEY,
    MARKER_FORMAT,
    MARKER_FORMAT_KEY,
    MARKER_KEY,
    MediaWalker,
)
from stepcore.store.codec import decode_messages, encode_message


class DictMediaStore:
    """A complete, process-local MediaStore (the protocol over a dict)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.contexts: dict[str, MediaContext] = {}

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        uri = media_uri(data)
        self.blobs[uri] = data
        self.contexts[uri] = context
        return uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        digest_of_uri(uri)
        if uri not in self.blobs:
            raise LookupError(uri)
        return self.blobs[uri]

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        return uri in self.blobs

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return None

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str] | None:
        return None


@pytest.fixture
def media() -> DictMediaStore:
    return DictMediaStore()


def marker(uri: str, encoding: str, version: Any = MARKER_FORMAT) -> dict[str, Any]:
    return {MARKER_KEY: uri, MARKER_FORMAT_KEY: version, 'encoding': encoding}


async def round_trip(walker: MediaWalker, value: Any) -> tuple[Any, Any]:
    stored = await walker.externalize_value(value)
    json.dumps(stored)  # the stored form is plain JSON
    return stored, await walker.restore_value(stored)


# -- thresholds -------------------------------------------------------------------------------


async def test_text_at_the_threshold_is_externalized(media: DictMediaStore) -> None:
    walker = MediaWalker(media, threshold_bytes=100)
    stored, restored = await round_trip(walker, {'content': 'a' * 100})
    uri = media_uri(b'a' * 100)
    assert stored == {'content': marker(uri, 'text')}
    assert restored == {'content': 'a' * 100}
    assert media.contexts[uri].media_type == 'text/plain; charset=utf-8'


async def test_text_one_byte_below_the_threshold_stays_inline(media: DictMediaStore) -> None:
    walker = MediaWalker(media, threshold_bytes=100)
    stored, restored = await round_trip(walker, ['a' * 99])
    assert stored == ['a' * 99]
    assert restored == ['a' * 99]
    assert media.blobs == {}


async def test_threshold_counts_utf8_bytes_not_characters(media: DictMediaStore) -> None:
    walker = MediaWalker(media, threshold_bytes=100)
    two_byte = 'é' * 50  # 50 characters, 100 bytes
    stored, restored = await round_trip(walker, two_byte)
    assert stored == marker(media_uri(two_byte.encode()), 'text')
    assert restored == two_byte
    four_byte = '𝄞' * 24  # 96 bytes
    assert await walker.externalize_value(four_byte) == four_byte


def test_default_threshold_is_64_kib() -> None:
    assert MediaWalker(None).threshold_bytes == DEFAULT_MEDIA_THRESHOLD_BYTES == 64 * 1024


@pytest.mark.parametrize('bad', [0, -1, True, 1.5, '10'])
def test_threshold_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(ValueError, match='media_threshold_bytes'):
        MediaWalker(None, threshold_bytes=bad)


# -- binary content ---------------------------------------------------------------------------


async def test_binary_content_round_trips_every_byte_value(media: DictMediaStore) -> None:
    data = bytes(range(256)) * 3  # pydantic writes URL-safe base64: '-' and '_' occur
    message = ModelRequest(parts=[UserPromptPart(content=['look', BinaryContent(data=data, media_type='image/png')])])
    encoded = encode_message(message)
    walker = MediaWalker(media, threshold_bytes=len(data))  # at the threshold: it leaves
    stored = await walker.externalize(encoded)
    assert media.blobs == {media_uri(data): data}
    assert media.contexts[media_uri(data)].media_type == 'image/png'
    assert len(stored) < len(encoded)
    assert await walker.restore(stored) == encoded
    [restored] = decode_messages([await walker.restore(stored)])
    assert restored == decode_messages([encoded])[0]


async def test_standard_alphabet_base64_is_restored_in_its_alphabet(media: DictMediaStore) -> None:
    data = b'\xfb\xff\xbf' * 4
    standard = base64.b64encode(data).decode()
    assert '+' in standard or '/' in standard
    walker = MediaWalker(media, threshold_bytes=len(data))
    stored, restored = await round_trip(walker, {'kind': 'binary', 'data': standard})
    assert stored['data'] == marker(media_uri(data), 'base64')
    assert restored == {'kind': 'binary', 'data': standard}


async def test_binary_content_below_the_threshold_stays_inline(media: DictMediaStore) -> None:
    # 900 bytes of binary are 1200 characters of base64: the threshold counts the bytes, and the
    # base64 string is not taken for a long string either.
    data = bytes(range(256)) * 3 + bytes(132)
    message = ModelRequest(parts=[UserPromptPart(content=[BinaryContent(data=data, media_type='image/png')])])
    encoded = encode_message(message)
    assert len(encoded) >= 1000
    walker = MediaWalker(media, threshold_bytes=1000)
    assert await walker.externalize(encoded) == encoded
    value = {'kind': 'binary', 'data': base64.b64encode(data).decode()}
    assert await walker.externalize_value(value) == value
    assert media.blobs == {}
    assert await MediaWalker(media, threshold_bytes=len(data)).externalize(encoded) != encoded
    assert media.blobs == {media_uri(data): data}


@pytest.mark.parametrize('data', ['hello world', 'aGVsbG8', 'aGVs\nbG8=', 'ÿÿ', '', '===='])
async def test_binary_shaped_strings_that_are_not_canonical_base64_stay_inline(
    media: DictMediaStore, data: str
) -> None:
    walker = MediaWalker(media)
    value = {'kind': 'binary', 'data': data}
    stored, restored = await round_trip(walker, value)
    assert restored == value
    if data:
        assert stored == value
        assert media.blobs == {}


async def test_without_a_media_store_binary_stays_inline() -> None:
    walker = MediaWalker(None)
    encoded = encode_message(
        ModelRequest(parts=[UserPromptPart(content=[BinaryContent(b'\x00\x01', media_type='image/png')])])
    )
    assert await walker.externalize(encoded) is encoded
    value = {'kind': 'binary', 'data': 'AAE=', 'text': 'x' * 10**6}
    assert await walker.externalize_value(value) == value


# -- reserved keys ----------------------------------------------------------------------------


async def test_reserved_keys_are_escaped_and_restored(media: DictMediaStore) -> None:
    payload = {
        MARKER_KEY: 'media+sha256://' + '0' * 64,
        MARKER_FORMAT_KEY: 99,
        ESCAPED_KEY: {MARKER_KEY: 'inner'},
        'encoding': 'base64',
        'plain': [1, None, {MARKER_FORMAT_KEY: 'x'}],
    }
    for walker in (MediaWalker(media), MediaWalker(None)):
        stored, restored = await round_trip(walker, payload)
        assert MARKER_KEY not in stored
        assert stored[MARKER_FORMAT_KEY] == MARKER_FORMAT
        assert set(stored[ESCAPED_KEY]) == {MARKER_KEY, MARKER_FORMAT_KEY, ESCAPED_KEY}
        assert restored == payload
    assert media.blobs == {}


async def test_escaping_happens_on_whole_messages_without_a_media_store() -> None:
    message = ModelRequest(parts=[ToolReturnPart(tool_name='t', content={MARKER_KEY: 'x'}, tool_call_id='c')])
    encoded = encode_message(message)
    walker = MediaWalker(None)
    stored = await walker.externalize(encoded)
    assert stored != encoded
    assert decode_messages([await walker.restore(stored)]) == [message]


async def test_plain_messages_pass_through_untouched(media: DictMediaStore) -> None:
    encoded = encode_message(ModelRequest(parts=[UserPromptPart(content='small')]))
    walker = MediaWalker(media)
    assert await walker.externalize(encoded) is encoded
    assert await walker.restore(encoded) is encoded


async def test_externalize_value_does_not_mutate_its_input(media: DictMediaStore) -> None:
    value = {'a': ['x' * 200, {MARKER_KEY: 1}], 'kind': 'binary', 'data': 'AAE='}
    snapshot = json.loads(json.dumps(value))
    await MediaWalker(media, threshold_bytes=100).externalize_value(value)
    assert value == snapshot


# -- markers on read ------------------------------------------------------------------------


@pytest.mark.parametrize('version', [2, 0, None, '1', True, 1.0])
async def test_marker_with_an_unknown_format_is_refused(media: DictMediaStore, version: Any) -> None:
    uri = await media.put(b'payload')
    walker = MediaWalker(media)
    with pytest.raises(ValueError, match='upgrade stepcore') as raised:
        await walker.restore_value({'content': marker(uri, 'text', version)})
    assert repr(version) in str(raised.value)


async def test_escaped_payload_with_an_unknown_format_is_refused(media: DictMediaStore) -> None:
    with pytest.raises(ValueError, match='format 7'):
        await MediaWalker(media).restore_value({ESCAPED_KEY: {MARKER_KEY: 'x'}, MARKER_FORMAT_KEY: 7})


async def test_malformed_escaped_entry_is_refused(media: DictMediaStore) -> None:
    with pytest.raises(ValueError, match='malformed'):
        await MediaWalker(media).restore_value({ESCAPED_KEY: 'not a mapping', MARKER_FORMAT_KEY: MARKER_FORMAT})


async def test_marker_with_an_unknown_encoding_is_refused(media: DictMediaStore) -> None:
    uri = await media.put(b'payload')
    with pytest.raises(ValueError, match="unknown encoding 'rot13'"):
        await MediaWalker(media).restore_value(marker(uri, 'rot13'))


async def test_marker_without_a_media_store_is_refused() -> None:
    uri = media_uri(b'payload')
    with pytest.raises(ValueError, match='no media_store'):
        await MediaWalker(None).restore_value(marker(uri, 'text'))


async def test_marker_whose_blob_is_missing_raises_lookup_error(media: DictMediaStore) -> None:
    with pytest.raises(LookupError):
        await MediaWalker(media).restore_value(marker(media_uri(b'gone'), 'base64url'))


async def test_restore_of_a_whole_stored_message_with_an_unknown_marker(media: DictMediaStore) -> None:
    walker = MediaWalker(media, threshold_bytes=10)
    message = ModelRequest(parts=[ToolReturnPart(tool_name='t', content='x' * 50, tool_call_id='c')])
    stored = await walker.externalize(encode_message(message))
    tampered = stored.replace(f'"{MARKER_FORMAT_KEY}":{MARKER_FORMAT}'.encode(), f'"{MARKER_FORMAT_KEY}":2'.encode())
    assert tampered != stored
    with pytest.raises(ValueError, match='format 2'):
        await walker.restore(tampered)
    assert decode_messages([await walker.restore(stored)]) == [message]
