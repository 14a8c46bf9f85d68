"""Versioned record (de)serialization and message encoding."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pydantic
import pytest
from pydantic_ai.messages import (
    BinaryContent,
    FilePart,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent
from stepcore.store.codec import (
    FORMAT_KEY,
    PLAIN_FORMAT_VERSION,
    check_format_version,
    decode_messages,
    dump_record,
    dump_record_compact,
    dump_record_json,
    encode_message,
    encode_messages,
    load_record,
)
from stepcore.store.models import RECORD_FORMAT_VERSION

T = datetime(2026, 1, 1, 12, 30, 15, 123456, tzinfo=UTC)


def test_dump_stamps_the_format_version() -> None:
    # plain JSON (an export) is format 1; a store's sealed bodies are format 2 (stepcore.engine._seal)
    data = dump_record(RunRecord(run_id='r', started_at=T, metadata={'k': 'v'}))
    assert data[FORMAT_KEY] == PLAIN_FORMAT_VERSION == 1
    assert data['run_id'] == 'r'
    assert json.loads(dump_record_json(RunRecord(run_id='r', started_at=T)))[FORMAT_KEY] == PLAIN_FORMAT_VERSION
    assert dump_record_compact(RunRecord(run_id='r')).startswith(b'{"format":%d' % RECORD_FORMAT_VERSION)


def test_dump_excludes_fields_on_request() -> None:
    data = dump_record(ContinuableSnapshot(run_id='r', step_index=0, messages=[]), exclude={'messages'})
    assert 'messages' not in data


def test_dump_json_is_compact_and_keeps_unicode() -> None:
    text = dump_record_json(RunRecord(run_id='r', metadata={'ü': '✓'}, started_at=T))
    assert ': ' not in text
    assert ', ' not in text
    assert '✓' in text


@pytest.mark.parametrize('form', ['dict', 'str', 'bytes'])
def test_load_round_trips_every_form(form: str) -> None:
    event = StepEvent(run_id='r', kind=EventKind.RUN_FAILED, error='boom', timestamp=T, seq=3, step_index=0)
    data: Any = dump_record(event)
    if form == 'str':
        data = json.dumps(data)
    elif form == 'bytes':
        data = json.dumps(data).encode()
    assert load_record(StepEvent, data) == event


def test_load_accepts_records_without_a_version_as_version_1() -> None:
    assert load_record(RunRecord, {'run_id': 'r', 'started_at': T.isoformat()}) == RunRecord(run_id='r', started_at=T)


def test_load_applies_extra_fields() -> None:
    data = dump_record(StepEvent(run_id='r', kind=EventKind.RUN_STARTED, timestamp=T, step_index=0))
    assert load_record(StepEvent, data, seq=9).seq == 9


def test_load_does_not_mutate_the_mapping() -> None:
    data = dump_record(RunRecord(run_id='r', started_at=T))
    copy = dict(data)
    load_record(RunRecord, data, agent_name='x')
    assert data == copy


def test_newer_format_is_refused_with_an_upgrade_hint() -> None:
    data = {**dump_record(RunRecord(run_id='r', started_at=T)), FORMAT_KEY: RECORD_FORMAT_VERSION + 1}
    with pytest.raises(ValueError, match='upgrade stepcore') as raised:
        load_record(RunRecord, data)
    message = str(raised.value)
    assert f'format version {RECORD_FORMAT_VERSION + 1}' in message
    assert 'RunRecord' in message


@pytest.mark.parametrize('version', [0, -1, True, '1', 1.0, None])
def test_invalid_format_versions_are_refused(version: object) -> None:
    with pytest.raises(ValueError, match='invalid format version'):
        check_format_version(version)


def test_current_version_is_accepted() -> None:
    check_format_version(RECORD_FORMAT_VERSION)
    check_format_version(1)


def test_messages_round_trip_through_the_encoding() -> None:
    messages = [
        ModelRequest(parts=[UserPromptPart(content='hi ✓', timestamp=T)], instructions='brief'),
        ModelResponse(
            parts=[TextPart(content='x'), ToolCallPart(tool_name='t', args={'a': [1]}, tool_call_id='c')], timestamp=T
        ),
    ]
    encoded = encode_messages(messages)
    assert encoded == [encode_message(m) for m in messages]
    assert all(isinstance(e, bytes) for e in encoded)
    assert decode_messages(encoded) == messages
    assert decode_messages([e.decode() for e in encoded]) == messages
    assert decode_messages([]) == []


def test_encoding_is_deterministic() -> None:
    message = ModelRequest(parts=[UserPromptPart(content='same', timestamp=T)])
    assert encode_message(message) == encode_message(decode_messages([encode_message(message)])[0])


def test_encoding_matches_pydantic_ais_message_union_byte_for_byte() -> None:
    # Each message class is encoded with an adapter of its own (faster than the union's); the
    # output must be what the `ModelMessage` union with base64 bytes gives, bytes in `Any` included.
    union = pydantic.TypeAdapter[ModelMessage](
        ModelMessage,  # pyright: ignore[reportArgumentType]
        config=pydantic.ConfigDict(ser_json_bytes='base64', val_json_bytes='base64'),
    )
    image = BinaryContent(data=bytes(range(256)), media_type='image/png')
    messages: list[ModelMessage] = [
        ModelRequest(
            parts=[
                SystemPromptPart(content='be brief', timestamp=T),
                UserPromptPart(content=['look ✓', image], timestamp=T),
                ToolReturnPart(tool_name='t', content={'rows': [1, 2]}, tool_call_id='c', timestamp=T),
                ToolReturnPart(tool_name='t', content='again', tool_call_id='d', outcome='failed', timestamp=T),
            ],
            instructions='brief',
            run_id='run',
            metadata={'raw': b'\xff\x00'},
        ),
        ModelResponse(
            parts=[
                ThinkingPart(content='hmm', signature='sig'),
                TextPart(content='x', provider_details={'raw': b'\xfe\x01'}),
                ToolCallPart(tool_name='t', args={'a': [1]}, tool_call_id='c'),
                FilePart(content=image),
            ],
            timestamp=T,
            provider_details={'blob': b'\x00\xff'},
        ),
    ]
    for message in messages:
        assert encode_message(message) == union.dump_json(message)
    assert encode_messages(messages) == [union.dump_json(m) for m in messages]
    assert [encode_message(m) for m in decode_messages(encode_messages(messages))] == encode_messages(messages)
