"""MongoStepStore behaviour specific to MongoDB, against the server at STEP_MONGO_URL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pymongo import AsyncMongoClient
from pymongo.errors import InvalidOperation, OperationFailure

import stepcore
from step_mongo.client import Document, MongoClient
from step_mongo.indexes import index_error
from step_mongo.media import MongoMediaStore
from step_mongo.store import NODE_PIECE_BYTES, MongoStepStore
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.store.codec import encode_messages

MAX_BSON_DOCUMENT = 16 * 1024 * 1024


@pytest.fixture
async def store(mongo_client: MongoClient, db_name: str) -> AsyncIterator[MongoStepStore]:
    s = MongoStepStore(client=mongo_client, database=db_name)
    yield s
    await s.aclose()


def _index_specs(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: {'key': list(spec['key']), **{k: v for k, v in spec.items() if k not in ('key', 'v', 'ns')}}
        for name, spec in info.items()
    }


async def test_indexes_are_created_on_first_write(store: MongoStepStore, mongo_client: MongoClient, db_name: str):
    db = mongo_client[db_name]
    assert await db.list_collection_names() == []  # constructing the store writes nothing
    await store.register_run(RunRecord(run_id='r1'))

    runs = _index_specs(await db['runs'].index_information())
    assert runs['conversation_id']['key'] == [('conversation_id', 1)]
    assert runs['conversation_id']['sparse'] is True
    assert runs['parent_run_id']['sparse'] is True
    assert runs['started_at']['key'] == [('started_at', 1)]

    events = _index_specs(await db['events'].index_information())
    assert events['run_id_seq']['key'] == [('run_id', 1), ('seq', 1)]
    keyed = events['run_id_idempotency_key']
    assert keyed['key'] == [('run_id', 1), ('idempotency_key', 1)]
    assert keyed['unique'] is True
    assert dict(keyed['partialFilterExpression']) == {'idempotency_key': {'$type': 'string'}}

    snapshots = _index_specs(await db['snapshots'].index_information())
    assert snapshots['run_id_seq']['key'] == [('run_id', 1), ('seq', 1)]
    assert snapshots['run_id_idempotency_key']['unique'] is True
    assert dict(snapshots['run_id_idempotency_key']['partialFilterExpression']) == {
        'idempotency_key': {'$type': 'string'}
    }
    assert snapshots['run_id_state_seq']['key'] == [('run_id', 1), ('state', 1), ('seq', 1)]

    effects = _index_specs(await db['tool_effects'].index_information())
    assert effects['run_id_tool_call_id']['key'] == [('run_id', 1), ('tool_call_id', 1)]
    assert effects['run_id_tool_call_id']['unique'] is True
    assert effects['run_id_status']['key'] == [('run_id', 1), ('status', 1)]

    nodes = _index_specs(await db['message_nodes'].index_information())
    assert nodes['run_id_n_part']['unique'] is True


async def test_none_idempotency_keys_append(store: MongoStepStore):
    for _ in range(3):
        await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, step_index=0))
        await store.save_snapshot(ContinuableSnapshot(run_id='r1', step_index=0, messages=[]))
    assert [e.seq for e in await store.list_events('r1')] == [1, 2, 3]
    assert [s.seq for s in await store.list_snapshots('r1', include_interrupted=True)] == [1, 2, 3]


ODD_KEYS = {'a.b': '1', '$where': '2', 'nul\x00byte': '3', 'ünï': '4'}


async def test_metadata_keys_need_not_be_field_names(store: MongoStepStore):
    await store.register_run(RunRecord(run_id='r1', metadata=ODD_KEYS))
    await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, metadata=ODD_KEYS, step_index=0))
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hi')])]
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', messages=messages, metadata=ODD_KEYS, step_index=0))
    run = await store.get_run('r1')
    assert run is not None
    assert run.metadata == ODD_KEYS
    assert [e.metadata for e in await store.list_events('r1')] == [ODD_KEYS]
    snapshot = await store.latest_snapshot('r1')
    assert snapshot is not None
    assert snapshot.metadata == ODD_KEYS


async def test_documents_hold_the_body_and_the_fields_queries_use(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str
):
    started = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    await store.register_run(RunRecord(run_id='r1', conversation_id='c', started_at=started, metadata={'k': 'v'}))
    await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, idempotency_key='e1', step_index=0))
    await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_COMPLETED, step_index=0))
    await store.record_tool_effect(
        ToolEffectRecord(
            run_id='r1',
            tool_call_id='c1',
            tool_name='t',
            started_at=started,
            args={'x': 1},
            status=ToolEffectStatus.STARTED,
        )
    )
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hi')])]
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', messages=messages, idempotency_key='s1', step_index=0))
    db = mongo_client[db_name]

    run = await db['runs'].find_one({'_id': 'r1'}, projection={'_id': 0})
    assert run is not None
    assert set(run) == {'conversation_id', 'started_at', 'started_at_us', 'body'}
    assert 'parent_run_id' not in run  # absent, so the sparse index skips the run
    assert run['started_at_us'] == 1767268800123456
    assert json.loads(run['body'])['metadata'] == {'k': 'v'}

    events = [d async for d in db['events'].find({'run_id': 'r1'}, projection={'_id': 0}, sort=[('seq', 1)])]
    assert [set(d) for d in events] == [{'run_id', 'seq', 'idempotency_key', 'body'}, {'run_id', 'seq', 'body'}]
    assert json.loads(events[0]['body'])['kind'] == 'run_started'

    effect = await db['tool_effects'].find_one({'run_id': 'r1'}, projection={'_id': 0})
    assert effect is not None
    assert set(effect) == {'run_id', 'tool_call_id', 'status', 'started_at', 'started_at_us', 'body'}
    assert effect['status'] == 'started'
    assert json.loads(effect['body'])['args'] == {'x': 1}

    snapshot = await db['snapshots'].find_one({'run_id': 'r1'}, projection={'_id': 0})
    assert snapshot is not None
    assert set(snapshot) == {'run_id', 'seq', 'state', 'head', 'length', 'idempotency_key', 'body'}
    assert (snapshot['seq'], snapshot['state'], snapshot['head'], snapshot['length']) == (1, 'complete', 1, 1)
    assert 'messages' not in json.loads(snapshot['body'])
    assert await db['snapshot_idempotency_keys'].find_one({'_id': {'run_id': 'r1', 'key': 's1'}}) is not None


async def test_tool_arguments_with_any_keys_round_trip(store: MongoStepStore):
    args = {'a.b': 1, '$x': [1, {'c.d': None}], 'nul\x00': 'v'}
    await store.record_tool_effect(
        ToolEffectRecord(run_id='r1', tool_call_id='c1', tool_name='t', args=args, status=ToolEffectStatus.STARTED)
    )
    effect = await store.get_tool_effect('r1', 'c1')
    assert effect is not None
    assert effect.args == args


async def test_times_keep_microseconds_and_sort_within_a_millisecond(store: MongoStepStore):
    base = datetime(2026, 1, 1, 12, 0, 0, 500, tzinfo=UTC)
    await store.register_run(
        RunRecord(run_id='later', conversation_id='c', started_at=base + timedelta(microseconds=2))
    )
    await store.register_run(RunRecord(run_id='earlier', conversation_id='c', started_at=base))
    runs = await store.list_runs(conversation_id='c')
    assert [r.run_id for r in runs] == ['earlier', 'later']
    assert runs[0].started_at == base


async def test_snapshots_store_each_message_once(store: MongoStepStore, mongo_client: MongoClient, db_name: str):
    history: list[Any] = []
    for i in range(5):
        history = [*history, ModelRequest(parts=[UserPromptPart(f'q{i}')]), ModelResponse(parts=[TextPart(f'a{i}')])]
        await store.save_snapshot(ContinuableSnapshot(run_id='r1', step_index=i, messages=history))
    db = mongo_client[db_name]
    assert await db['message_nodes'].count_documents({'run_id': 'r1'}) == 10
    snapshot_docs = [d async for d in db['snapshots'].find({'run_id': 'r1'}, sort=[('seq', 1)])]
    assert [d['length'] for d in snapshot_docs] == [2, 4, 6, 8, 10]
    assert all('messages' not in d for d in snapshot_docs)
    listed = await store.list_snapshots('r1', include_interrupted=True)
    assert [len(s.messages) for s in listed] == [2, 4, 6, 8, 10]
    assert listed[-1].messages == history


async def test_a_message_bigger_than_a_document_is_split_and_round_trips(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str
):
    # 290 parts of 60 KiB stay under the 64 KiB externalization threshold, yet total > 16 MiB.
    part = 'x' * (60 * 1024)
    request = ModelRequest(parts=[UserPromptPart(f'{i:04d}{part}') for i in range(290)])
    messages = [request, ModelResponse(parts=[TextPart('done')])]
    await store.save_snapshot(ContinuableSnapshot(run_id='big', messages=messages, step_index=0))

    db = mongo_client[db_name]
    sizes: list[int] = []
    async for raw in db.get_collection('message_nodes').find_raw_batches({'run_id': 'big'}):
        sizes.extend(len(bson.encode(d)) for d in bson.decode_all(raw))
    assert sum(sizes) > MAX_BSON_DOCUMENT
    assert max(sizes) <= NODE_PIECE_BYTES + 1024 < MAX_BSON_DOCUMENT
    head = await db['message_nodes'].find_one({'run_id': 'big', 'part': 0, 'parent': None})
    assert head is not None
    assert head['parts'] == len([s for s in sizes if s > 1024])
    assert head['parts'] >= 3
    assert await db['media'].count_documents({}) == 0  # nothing was at the threshold

    restored = await store.latest_snapshot('big')
    assert restored is not None
    assert restored.messages == messages


async def test_binary_content_goes_to_the_media_store_on_the_same_client(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str
):
    assert isinstance(store.media_store, MongoMediaStore)
    assert store.media_store.client is store.client
    image = BinaryContent(data=b'\x89PNG' + bytes(range(256)) * 260, media_type='image/png')  # over 64 KiB
    messages = [ModelRequest(parts=[UserPromptPart(['look', image])])]
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', messages=messages, step_index=0))
    db = mongo_client[db_name]
    manifest = await db['media'].find_one({})
    assert manifest is not None
    assert manifest['media_type'] == 'image/png'
    node = await db['message_nodes'].find_one({'run_id': 'r1'})
    assert node is not None
    assert b'media+sha256://' in bytes(node['body'])
    restored = await store.latest_snapshot('r1')
    assert restored is not None
    # pydantic-ai decodes an image BinaryContent as its BinaryImage subclass: compare encodings.
    assert encode_messages(restored.messages) == encode_messages(messages)


async def test_media_store_none_keeps_bytes_inline(mongo_client: MongoClient, db_name: str):
    store = MongoStepStore(client=mongo_client, database=db_name, media_store=None)
    image = BinaryContent(data=b'\x00\x01' * 100, media_type='application/octet-stream')
    messages = [ModelRequest(parts=[UserPromptPart([image])])]
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', messages=messages, step_index=0))
    assert 'media' not in await mongo_client[db_name].list_collection_names()
    restored = await store.latest_snapshot('r1')
    assert restored is not None
    assert encode_messages(restored.messages) == encode_messages(messages)


async def test_a_retried_registration_is_accepted_and_a_duplicate_refused(store: MongoStepStore):
    await store.register_run(RunRecord(run_id='r1', registration_id='reg-1'))
    await store.register_run(RunRecord(run_id='r1', registration_id='reg-1'))
    with pytest.raises(ValueError, match="run_id 'r1' is already in the store"):
        await store.register_run(RunRecord(run_id='r1', registration_id='reg-2'))


async def test_a_given_client_stays_open_after_aclose(mongo_client: MongoClient, db_name: str):
    store = MongoStepStore(client=mongo_client, database=db_name)
    await store.register_run(RunRecord(run_id='r1'))
    await store.aclose()
    assert (await mongo_client.admin.command('ping'))['ok'] == 1


async def test_aclose_closes_a_client_the_store_created(mongo_url: str, db_name: str):
    store = MongoStepStore(db_url=mongo_url, database=db_name)
    await store.register_run(RunRecord(run_id='r1'))
    await store.aclose()
    with pytest.raises(InvalidOperation):
        await store.client.admin.command('ping')


async def test_from_spec_builds_a_working_store(mongo_url: str, db_name: str):
    store = stepcore.from_spec('mongo', db_url=mongo_url, database=db_name, max_snapshots_per_run=2)
    try:
        assert isinstance(store, MongoStepStore)
        assert store.database_name == db_name
        assert store.max_snapshots_per_run == 2
        await store.register_run(RunRecord(run_id='r1', agent_name='a'))
        got = await store.get_run('r1')
        assert got is not None
        assert got.agent_name == 'a'
    finally:
        await store.aclose()
    media = stepcore.media_from_spec('mongo', db_url=mongo_url, database=db_name)
    try:
        assert isinstance(media, MongoMediaStore)
        uri = await media.put(b'blob')
        assert await media.get(uri) == b'blob'
    finally:
        await media.aclose()


async def test_database_defaults_to_the_one_in_the_url(mongo_url: str, db_name: str):
    base, _, query = mongo_url.partition('?')
    url = f'{base.rstrip("/")}/{db_name}' + (f'?{query}' if query else '')
    store = MongoStepStore(db_url=url)
    try:
        assert store.database_name == db_name
    finally:
        await store.aclose()


async def test_duplicate_tool_effects_block_the_unique_index_with_a_clear_error(
    mongo_client: MongoClient, db_name: str
):
    effects = mongo_client[db_name]['tool_effects']
    await effects.insert_many([{'run_id': 'r1', 'tool_call_id': 'c1'}, {'run_id': 'r1', 'tool_call_id': 'c1'}])
    store = MongoStepStore(client=mongo_client, database=db_name)
    with pytest.raises(RuntimeError, match='duplicate keys') as raised:
        await store.register_run(RunRecord(run_id='r2'))
    assert 'tool_effects' in str(raised.value)
    assert 'Remove the duplicates' in str(raised.value)
    await effects.delete_many({})
    await store.register_run(RunRecord(run_id='r2'))  # indexes are retried on the next write
    assert await store.get_run('r2') is not None


def test_a_missing_privilege_names_the_fix():
    failure = OperationFailure('not authorized on db to execute command createIndexes', code=13)
    error = index_error('db.runs', [], failure)
    assert isinstance(error, PermissionError)
    assert 'createIndex privilege' in str(error)
    assert 'readWrite' in str(error)


def test_constructor_errors_say_what_to_pass():
    with pytest.raises(ValueError, match=r'exactly one of client= or db_url=, got neither: pass client= .* or db_url='):
        MongoStepStore()
    with pytest.raises(ValueError, match="expected a 'mongodb://'"):
        MongoStepStore(db_url='postgres://x')
    with pytest.raises(ValueError, match='max_snapshots_per_run must be >= 1 or None, got 0'):
        MongoStepStore(db_url='mongodb://127.0.0.1:1', max_snapshots_per_run=0)
    with pytest.raises(ValueError, match='media_threshold_bytes=0'):
        MongoStepStore(db_url='mongodb://127.0.0.1:1', media_threshold_bytes=0)
    with pytest.raises(ValueError, match='not a valid MongoDB database name'):
        MongoStepStore(db_url='mongodb://127.0.0.1:1', database='a.b')


async def test_client_and_db_url_are_exclusive(mongo_url: str):
    client: MongoClient = AsyncMongoClient[Document](mongo_url)
    try:
        with pytest.raises(ValueError, match='not both'):
            MongoStepStore(client=client, db_url=mongo_url)
    finally:
        await client.close()


@pytest.mark.parametrize('store_class', [MongoStepStore, MongoMediaStore], ids=lambda c: c.__name__)
async def test_exactly_one_of_client_and_db_url_is_taken(
    store_class: type[MongoStepStore] | type[MongoMediaStore], mongo_url: str
):
    """Both or neither raise `ValueError` with the words "exactly one", next to what to pass."""
    client: MongoClient = AsyncMongoClient[Document](mongo_url)
    try:
        with pytest.raises(ValueError, match=r'takes exactly one of client= or db_url=, not both') as both:
            store_class(client=client, db_url=mongo_url)
        assert str(both.value).startswith(f'{store_class.__name__} takes exactly one')
    finally:
        await client.close()
    with pytest.raises(ValueError, match=r'needs exactly one of client= or db_url=, got neither') as neither:
        store_class()
    assert "db_url= (a connection string such as 'mongodb://127.0.0.1:27017')" in str(neither.value)


async def test_dates_read_back_aware_in_utc(store: MongoStepStore):
    """The stores' codec options decode BSON dates as aware datetimes in UTC."""
    started = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    await store.register_run(RunRecord(run_id='r1', started_at=started))
    doc = await store.database['runs'].find_one({'_id': 'r1'})
    assert doc is not None
    stored = doc['started_at']
    assert isinstance(stored, datetime)
    assert stored.utcoffset() == timedelta(0)
    assert stored == started.replace(microsecond=123000)  # BSON dates hold milliseconds
    assert (stored.hour, stored.tzname()) == (10, 'UTC')
    run = await store.get_run('r1')
    assert run is not None
    assert run.started_at == started  # exact, from the microsecond twin


async def test_a_shared_client_with_other_codec_options_works(mongo_url: str, db_name: str):
    client = AsyncMongoClient[RawBSONDocument](mongo_url, document_class=RawBSONDocument)
    try:
        store = MongoStepStore(client=client, database=db_name)
        started = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
        await store.register_run(RunRecord(run_id='r1', started_at=started, metadata={'k': 'v'}))
        messages = [ModelRequest(parts=[UserPromptPart('hi')])]
        await store.save_snapshot(ContinuableSnapshot(run_id='r1', messages=messages, step_index=0))
        run = await store.get_run('r1')
        assert run is not None
        assert run.started_at == started
        assert run.metadata == {'k': 'v'}
        snap = await store.latest_snapshot('r1')
        assert snap is not None
        assert snap.messages == messages
    finally:
        await client.close()


async def _fill(store: MongoStepStore, run_id: str) -> None:
    await store.register_run(RunRecord(run_id=run_id))
    await store.append_event(StepEvent(run_id=run_id, kind=EventKind.RUN_STARTED, idempotency_key='e', step_index=0))
    await store.record_tool_effect(
        ToolEffectRecord(run_id=run_id, tool_call_id='c1', tool_name='t', status=ToolEffectStatus.STARTED)
    )
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hi')])]
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, messages=messages, idempotency_key='s', step_index=0))


async def _documents_of(db: Any, run_id: str) -> dict[str, int]:
    counts = {'runs': await db['runs'].count_documents({'_id': run_id})}
    for name in ('events', 'tool_effects', 'snapshots', 'message_nodes'):
        counts[name] = await db[name].count_documents({'run_id': run_id})
    counts['snapshot_idempotency_keys'] = await db['snapshot_idempotency_keys'].count_documents({'_id.run_id': run_id})
    counts['counters'] = await db['counters'].count_documents({'_id': {'$regex': f'/{run_id}$'}})
    return counts


async def test_delete_run_removes_its_documents_from_every_collection(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str
):
    db = mongo_client[db_name]
    await _fill(store, 'r1')
    await _fill(store, 'r2')
    assert set((await _documents_of(db, 'r1')).values()) == {1, 3}  # three counters, one of everything else
    kept = await _documents_of(db, 'r2')

    assert await store.delete_run('r1') is True
    left = await _documents_of(db, 'r1')
    assert left.pop('counters') == 1, 'the node id counter stays, so node ids are never handed out twice'
    assert set(left.values()) == {0}
    assert await _documents_of(db, 'r2') == kept
    assert await store.delete_run('r1') is False

    await _fill(store, 'r1')  # the id starts afresh: seqs from 1, the snapshot key is not applied
    assert [e.seq for e in await store.list_events('r1')] == [1]
    assert [s.seq for s in await store.list_snapshots('r1', include_interrupted=True)] == [1]
