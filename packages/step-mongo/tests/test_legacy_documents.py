"""Documents written before record bodies (fields spread over the document) stay readable and writable.

The documents below are laid out exactly as those releases of `MongoStepStore` wrote them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from bson.binary import Binary
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_mongo.client import CODEC_OPTIONS, Document, MongoClient
from step_mongo.store import MongoStepStore
from stepcore import ContinuableSnapshot, EventKind, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.engine import DamagedRecordError
from stepcore.store.codec import encode_message

STARTED = datetime(2026, 12, 3, 8, 16, 49, 184538, tzinfo=UTC)
STAMPED = datetime(2026, 12, 3, 8, 16, 49, 198205, tzinfo=UTC)
CREATED = datetime(2026, 12, 3, 8, 16, 49, 209132, tzinfo=UTC)
REQUEST = (
    b'{"parts":[{"content":"hi","timestamp":"2026-12-03T08:16:49.208771Z","part_kind":"user-prompt"}],'
    b'"timestamp":null,"instructions":null,"kind":"request","run_id":null,"conversation_id":null,'
    b'"metadata":null,"state":"complete"}'
)
RESPONSE = ModelResponse(parts=[TextPart('yo')])


def _ms(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


LEGACY: dict[str, list[Document]] = {
    'runs': [
        {
            '_id': 'r1',
            'agent_name': 'a',
            'conversation_id': 'c1',
            'format': 1,
            'metadata': {'team': 'x'},
            'registration_id': None,
            'started_at': _ms(STARTED),
            'started_at_us': 1796285809184538,
        }
    ],
    'events': [
        {
            'agent_name': None,
            'conversation_id': None,
            'error': None,
            'format': 1,
            'idempotency_key': 'k1',
            'kind': 'run_started',
            'metadata': {'m': 'v'},
            'parent_run_id': None,
            'run_id': 'r1',
            'seq': 1,
            'step_index': 0,
            'timestamp': _ms(STAMPED),
            'timestamp_us': 1796285809198205,
            'tool_call_id': None,
            'tool_name': None,
        }
    ],
    'tool_effects': [
        {
            'args_json': '{"a.b": 1}',
            'effect_summary': None,
            'error': None,
            'format': 1,
            'idempotency_key': None,
            'run_id': 'r1',
            'started_at': _ms(STARTED),
            'started_at_us': 1796285809184538,
            'status': 'started',
            'step_index': 0,
            'tool_call_id': 't1',
            'tool_name': 'tool',
            'updated_at': _ms(STAMPED),
            'updated_at_us': 1796285809198205,
        }
    ],
    'snapshots': [
        {
            'agent_name': None,
            'conversation_id': None,
            'created_at': _ms(CREATED),
            'created_at_us': 1796285809209132,
            'format': 1,
            'head': 2,
            'idempotency_key': 's1',
            'length': 2,
            'metadata': {'q': 'w'},
            'parent_run_id': None,
            'run_id': 'r1',
            'seq': 1,
            'state': 'complete',
            'step_index': 0,
        }
    ],
    'message_nodes': [
        {'run_id': 'r1', 'n': 1, 'part': 0, 'parent': None, 'parts': 1, 'body': Binary(REQUEST)},
        {'run_id': 'r1', 'n': 2, 'part': 0, 'parent': 1, 'parts': 1, 'body': Binary(encode_message(RESPONSE))},
    ],
    'snapshot_idempotency_keys': [{'_id': {'run_id': 'r1', 'key': 's1'}, 'seq': 1}],
    'counters': [
        {'_id': 'events/r1', 'value': 1},
        {'_id': 'nodes/r1', 'value': 2},
        {'_id': 'snapshots/r1', 'value': 1},
    ],
}


@pytest.fixture
async def db(mongo_client: MongoClient, db_name: str) -> Any:
    db = mongo_client.get_database(db_name, codec_options=CODEC_OPTIONS)
    for name, docs in LEGACY.items():
        await db[name].insert_many([dict(d) for d in docs])
    return db


@pytest.fixture
async def store(db: Any, mongo_client: MongoClient, db_name: str) -> AsyncIterator[MongoStepStore]:
    store = MongoStepStore(client=mongo_client, database=db_name)
    yield store
    await store.aclose()


async def test_every_kind_of_record_reads_back_exactly(store: MongoStepStore):
    run = await store.get_run('r1')
    assert run is not None
    assert (run.agent_name, run.conversation_id, run.metadata, run.started_at) == ('a', 'c1', {'team': 'x'}, STARTED)
    assert [r.run_id for r in await store.list_runs(conversation_id='c1')] == ['r1']

    (event,) = await store.list_events('r1')
    assert (event.seq, event.kind, event.idempotency_key, event.metadata) == (
        1,
        EventKind.RUN_STARTED,
        'k1',
        {'m': 'v'},
    )
    assert event.timestamp == STAMPED

    effect = await store.get_tool_effect('r1', 't1')
    assert effect is not None
    assert (effect.args, effect.status, effect.started_at, effect.updated_at) == (
        {'a.b': 1},
        ToolEffectStatus.STARTED,
        STARTED,
        STAMPED,
    )
    assert [e.tool_call_id for e in await store.list_unresolved_tool_effects('r1')] == ['t1']

    snapshot = await store.latest_snapshot('r1')
    assert snapshot is not None
    assert (snapshot.seq, snapshot.idempotency_key, snapshot.metadata, snapshot.created_at) == (
        1,
        's1',
        {'q': 'w'},
        CREATED,
    )
    assert [type(m) for m in snapshot.messages] == [ModelRequest, ModelResponse]
    assert snapshot.messages[1] == RESPONSE


async def test_new_writes_continue_a_run_stored_before(store: MongoStepStore, db: Any):
    snapshot = await store.latest_snapshot('r1')
    assert snapshot is not None
    await store.save_snapshot(snapshot.model_copy(update={'seq': None}))  # key s1: already applied
    assert await db['snapshots'].count_documents({'run_id': 'r1'}) == 1

    await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, idempotency_key='k1', step_index=0))
    await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_COMPLETED, step_index=0))
    assert [e.seq for e in await store.list_events('r1')] == [1, 2]

    messages = [*snapshot.messages, ModelRequest(parts=[UserPromptPart('again')])]
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', messages=messages, step_index=1))
    latest = await store.latest_snapshot('r1')
    assert latest is not None
    assert latest.seq == 2
    assert latest.messages == messages
    assert await db['message_nodes'].count_documents({'run_id': 'r1', 'n': {'$gt': 2}}) == 3  # numbered on

    await store.record_tool_effect(
        ToolEffectRecord(run_id='r1', tool_call_id='t1', tool_name='tool', status=ToolEffectStatus.COMPLETED)
    )
    effect = await store.get_tool_effect('r1', 't1')
    assert effect is not None
    assert effect.status is ToolEffectStatus.COMPLETED
    replaced = await db['tool_effects'].find_one({'run_id': 'r1', 'tool_call_id': 't1'})
    assert 'body' in replaced
    assert 'args_json' not in replaced


async def test_a_document_that_does_not_convert_reads_as_damaged(
    store: MongoStepStore, db: Any, caplog: pytest.LogCaptureFixture
):
    await db['tool_effects'].update_one({'tool_call_id': 't1'}, {'$set': {'args_json': '{not json'}})
    with pytest.raises(DamagedRecordError, match=r"tool call 't1' of run 'r1'.*does not convert: JSONDecodeError"):
        await store.list_tool_effects('r1')

    await db['events'].update_one({'seq': 1}, {'$unset': {'timestamp_us': ''}})
    with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
        assert await store.list_events('r1') == []
    assert any("event seq=1 of run 'r1'" in r.getMessage() for r in caplog.records)

    await db['snapshots'].update_one({'seq': 1}, {'$set': {'length': 'two'}})
    with pytest.raises(DamagedRecordError, match=r"snapshot seq=1 of run 'r1'.*length='two'"):
        await store.latest_snapshot('r1')
