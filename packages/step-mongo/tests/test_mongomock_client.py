"""The stores on mongomock-motor's in-memory `AsyncMongoMockClient`, passed as `client=`.

pydantic-ai-harness's tests run its MongoDB stores on this client, so users of it pass one to ours
too. These tests need no server; they run beside the ones against STEP_MONGO_URL, which stay the
reference for how the stores behave on MongoDB.

The conformance kit runs on the mock client too, on a store that does not declare `persistent`:
mongomock's data lives in this process's memory, where no other process (a second writer, a
process killed mid tool call) can reach it. Every other section of the kit passes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar, TypeAlias

import mongomock
import pytest
from mongomock_motor import AsyncMongoMockClient
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryImage,
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pymongo import AsyncMongoClient

from step_mongo import MongoMediaStore, MongoStepStore
from step_mongo.client import Document
from step_mongo.compat import is_mongomock, is_synchronous_mongomock
from stepcore import (
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    StepPersistence,
    ToolEffectRecord,
    ToolEffectStatus,
    continue_run,
    is_provider_valid,
)
from stepcore.common.features import PERSISTENT
from stepcore.media import DamagedMediaError, MediaContext, media_uri
from stepcore_conformance import MediaDamage, MediaStoreConformance, StepStoreConformance

MockClient: TypeAlias = 'AsyncMongoMockClient[Document]'


class InMemoryMongoStepStore(MongoStepStore):
    """The Mongo store on an in-memory client: everything but persistence, which another process
    cannot have (mongomock's data lives in this process only)."""

    features: ClassVar[frozenset[str]] = MongoStepStore.features - {PERSISTENT}


@pytest.fixture
def mock_client() -> MockClient:
    """A fresh in-memory client: every test starts from empty databases."""
    return AsyncMongoMockClient()


class TestMongomockStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(self, mock_client: MockClient, store_options: dict[str, Any]) -> AsyncIterator[MongoStepStore]:
        store = InMemoryMongoStepStore(client=mock_client, database='kit', **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def damage(self, mongo_damage: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        return mongo_damage


class TestMongomockMediaStore(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self, mock_client: MockClient) -> AsyncIterator[MongoMediaStore]:
        store = MongoMediaStore(client=mock_client, database='kit')
        yield store
        await store.aclose()

    @pytest.fixture
    def media_damage(self, mongo_media_damage: MediaDamage) -> MediaDamage:
        return mongo_media_damage

    @pytest.fixture
    async def gc_step_store(
        self, mock_client: MockClient, media_store: MongoMediaStore
    ) -> AsyncIterator[MongoStepStore]:
        store = MongoStepStore(client=mock_client, database='kit', media_store=media_store, media_threshold_bytes=1024)
        yield store
        await store.aclose()


# -- a real agent run ---------------------------------------------------------------------------

IMAGE = bytes(range(256)) * 300  # 75 KiB: over the 64 KiB threshold, so it goes to the media collections


def _pages_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Step 1 fetches page 0, step 2 pages 1 and 2 at once, step 3 answers with what it read."""
    step = sum(isinstance(m, ModelResponse) for m in messages)
    if step == 0:
        return ModelResponse(parts=[ToolCallPart('fetch', {'n': 0}, tool_call_id='c0')])
    if step == 1:
        return ModelResponse(
            parts=[
                ToolCallPart('fetch', {'n': 1}, tool_call_id='c1'),
                ToolCallPart('fetch', {'n': 2}, tool_call_id='c2'),
            ]
        )
    read = sorted(str(p.content) for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
    return ModelResponse(parts=[TextPart(f'read {", ".join(read)}')])


def _pages_agent(store: MongoStepStore, **persistence: Any) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(_pages_model), name='reader', capabilities=[StepPersistence(store=store, **persistence)]
    )

    @agent.tool_plain
    def fetch(n: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'page {n}'

    return agent


async def test_an_agent_run_is_recorded_and_continues(mock_client: MockClient):
    store = MongoStepStore(client=mock_client, database='x')
    prompt: list[UserContent] = ['read the pages and look', BinaryImage(data=IMAGE, media_type='image/png')]
    result = await _pages_agent(store).run(prompt, conversation_id='conv-1')
    run_id = result.run_id
    assert result.output == 'read page 0, page 1, page 2'

    [run] = await store.list_runs()
    assert (run.run_id, run.agent_name, run.conversation_id) == (run_id, 'reader', 'conv-1')
    assert run.started_at.tzinfo is not None

    kinds = [e.kind for e in await store.list_events(run_id)]
    assert (kinds[0], kinds[-1]) == (EventKind.RUN_STARTED, EventKind.RUN_COMPLETED)
    assert Counter(kinds) == {
        EventKind.RUN_STARTED: 1,
        EventKind.MODEL_REQUEST_STARTED: 3,
        EventKind.MODEL_REQUEST_COMPLETED: 3,
        EventKind.TOOL_CALL_STARTED: 3,
        EventKind.TOOL_CALL_COMPLETED: 3,
        EventKind.RUN_COMPLETED: 1,
    }
    assert [e.seq for e in await store.list_events(run_id)] == list(range(1, len(kinds) + 1))

    effects = sorted(await store.list_tool_effects(run_id), key=lambda e: e.tool_call_id)
    assert [(e.tool_call_id, e.tool_name, e.status, e.args) for e in effects] == [
        ('c0', 'fetch', ToolEffectStatus.COMPLETED, {'n': 0}),
        ('c1', 'fetch', ToolEffectStatus.COMPLETED, {'n': 1}),
        ('c2', 'fetch', ToolEffectStatus.COMPLETED, {'n': 2}),
    ]
    assert await store.list_unresolved_tool_effects(run_id) == []

    latest = await store.latest_snapshot(run_id)
    assert latest is not None
    assert latest.state is SnapshotState.COMPLETE
    assert latest.messages == result.all_messages()
    assert len(await store.list_snapshots(run_id)) >= 3

    # The image went to the default MongoMediaStore on the same mock client and database.
    assert isinstance(store.media_store, MongoMediaStore)
    assert store.media_store.client is mock_client
    db = mock_client['x']
    [manifest] = await db['media'].find({}).to_list()
    assert (manifest['_id'], manifest['length'], manifest['media_type']) == (
        media_uri(IMAGE).removeprefix('media+sha256://'),
        len(IMAGE),
        'image/png',
    )
    stored = b''.join([bytes(c['data']) async for c in db['media_chunks'].find({}, sort=[('n', 1)])])
    assert stored == IMAGE
    node_bytes = sum([len(bytes(n['body'])) async for n in db['message_nodes'].find({'run_id': run_id})])
    assert 0 < node_bytes < len(IMAGE) // 4  # the messages hold a reference, not the image

    # Another store object on the same client reads it all back and continues the conversation.
    reader = MongoStepStore(client=mock_client, database='x')
    history = await continue_run(reader, run_id=run_id)
    assert history == result.all_messages()
    assert is_provider_valid(history)

    def recall(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        earlier = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(f'earlier: {earlier}')])

    follow_up = Agent(FunctionModel(recall), capabilities=[StepPersistence(store=reader)])
    resumed = await follow_up.run('what did you read?', message_history=history, conversation_id='conv-1')
    assert resumed.output == "earlier: ['page 0', 'page 1', 'page 2']"
    assert [r.run_id for r in await reader.list_runs(conversation_id='conv-1')] == [run_id, resumed.run_id]
    await reader.aclose()
    await store.aclose()


async def test_a_failing_tool_leaves_its_sibling_unresolved(mock_client: MockClient):
    store = MongoStepStore(client=mock_client, database='x')

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = sum(isinstance(m, ModelResponse) for m in messages)
        if step == 0:
            return ModelResponse(parts=[ToolCallPart('fetch', {'n': 0}, tool_call_id='c0')])
        return ModelResponse(
            parts=[ToolCallPart('fetch', {'n': 1}, tool_call_id='c1'), ToolCallPart('explode', {}, tool_call_id='c2')]
        )

    agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, run_id='r1')])

    @agent.tool_plain
    def fetch(n: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'page {n}'

    @agent.tool_plain
    def explode() -> str:  # pyright: ignore[reportUnusedFunction]
        raise RuntimeError('disk on fire')

    with pytest.raises(RuntimeError, match='disk on fire'):
        await agent.run('go')

    statuses = {e.tool_call_id: e.status for e in await store.list_tool_effects('r1')}
    assert statuses == {'c0': ToolEffectStatus.COMPLETED, 'c1': ToolEffectStatus.STARTED, 'c2': ToolEffectStatus.FAILED}
    [unresolved] = await store.list_unresolved_tool_effects('r1')
    assert (unresolved.tool_call_id, unresolved.tool_name, unresolved.args) == ('c1', 'fetch', {'n': 1})
    assert [e.kind for e in await store.list_events('r1')][-1] is EventKind.RUN_FAILED
    newest = await store.latest_snapshot('r1', include_interrupted=True)
    assert newest is not None
    assert newest.state is SnapshotState.INTERRUPTED
    settled = await continue_run(store, run_id='r1')
    assert is_provider_valid(settled)
    assert [p.tool_call_id for p in settled[-1].parts if isinstance(p, ToolReturnPart)] == ['c0']


# -- the media store on its own -----------------------------------------------------------------


async def test_media_store_round_trips_chunked_blobs(mock_client: MockClient):
    media = MongoMediaStore(client=mock_client, database='m', chunk_size_bytes=1000)
    data = bytes(range(250)) * 10  # 2500 bytes: three chunks
    context = MediaContext(media_type='image/png', filename='a.png', metadata={'source': 'camera', 'k.$': 'v'})
    uri = await media.put(data, context=context)
    assert uri == media_uri(data)
    assert await media.get(uri) == data
    assert await media.exists(uri) is True
    assert await media.get_metadata(uri) == {'source': 'camera', 'k.$': 'v'}
    chunks = mock_client['m']['media_chunks']
    assert [c['n'] async for c in chunks.find({}, sort=[('n', 1)])] == [0, 1, 2]

    assert await media.put(data) == uri  # stored already: nothing new is written
    assert await chunks.count_documents({}) == 3
    assert await media.get_metadata(uri) == {'source': 'camera', 'k.$': 'v'}
    [listed] = [m async for m in media.list_media()]
    assert (listed.uri, listed.size) == (uri, len(data))

    missing = media_uri(b'never stored')
    assert await media.exists(missing) is False
    for read in (media.get, media.get_metadata):
        with pytest.raises(LookupError, match='media not found'):
            await read(missing)

    assert await media.delete_media(uri) is True
    assert await media.exists(uri) is False
    assert await chunks.count_documents({}) == 0
    await media.aclose()


async def test_a_damaged_blob_is_reported(mock_client: MockClient):
    media = MongoMediaStore(client=mock_client, database='m', chunk_size_bytes=4)
    uri = await media.put(b'0123456789')
    await mock_client['m']['media_chunks'].delete_one({'n': 1})
    with pytest.raises(DamagedMediaError, match='is unparsable: its 4 stored bytes have sha256'):
        await media.get(uri)


# -- where mongomock differs --------------------------------------------------------------------


async def test_partial_unique_indexes_keep_their_filter(mock_client: MockClient):
    """mongomock's `create_indexes` drops `partialFilterExpression`: the store keeps it."""
    store = MongoStepStore(client=mock_client, database='x')
    await store.register_run(RunRecord(run_id='r1'))
    for name in ('events', 'snapshots'):
        keyed = (await mock_client['x'][name].index_information())['run_id_idempotency_key']
        assert keyed['unique'] is True
        assert keyed['partialFilterExpression'] == {'idempotency_key': {'$type': 'string'}}
    # so any number of events without a key are kept, and a key is applied once
    for key in (None, None, 'k', 'k', None):
        await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, idempotency_key=key, step_index=0))
    assert [(e.seq, e.idempotency_key) for e in await store.list_events('r1')] == [
        (1, None),
        (2, None),
        (3, 'k'),
        (4, None),
    ]


async def test_ledger_entries_are_replaced_in_order(mock_client: MockClient):
    """The ledger's replace-or-insert writes (a bulk write on a server) on mongomock."""
    store = MongoStepStore(client=mock_client, database='x')
    await store.register_run(RunRecord(run_id='r1'))
    first = ToolEffectRecord(
        run_id='r1', tool_call_id='c1', tool_name='t', args={'a': 1}, status=ToolEffectStatus.STARTED
    )
    second = ToolEffectRecord(run_id='r1', tool_call_id='c2', tool_name='t', status=ToolEffectStatus.STARTED)
    await store.write_batch([first, second])
    done = first.model_copy(update={'status': ToolEffectStatus.COMPLETED, 'effect_summary': 'ok'})
    await store.write_batch([done])
    assert await mock_client['x']['tool_effects'].count_documents({'run_id': 'r1'}) == 2
    effects = {e.tool_call_id: e for e in await store.list_tool_effects('r1')}
    assert (effects['c1'].status, effects['c1'].effect_summary, effects['c1'].args) == (
        ToolEffectStatus.COMPLETED,
        'ok',
        {'a': 1},
    )
    assert [e.tool_call_id for e in await store.list_unresolved_tool_effects('r1')] == ['c2']


async def test_without_database_the_default_one_is_used(mock_client: MockClient):
    """mongomock's `get_default_database` hands out its synchronous database: the store gets the async one."""
    store = MongoStepStore(client=mock_client)
    assert store.database_name == 'stepcore'
    await store.register_run(RunRecord(run_id='r1'))
    assert await mock_client['stepcore']['runs'].count_documents({'_id': 'r1'}) == 1

    named = AsyncMongoMockClient('mongodb://localhost/agents')
    media = MongoMediaStore(client=named)
    assert media.database_name == 'agents'
    uri = await media.put(b'blob')
    assert await named['agents']['media'].count_documents({}) == 1
    assert await media.get(uri) == b'blob'


class _SubscriptOnly:
    """Hands out databases by `client[name]` and nothing else."""

    def __init__(self, client: MockClient) -> None:
        self._wrapped = client

    def __getitem__(self, name: str) -> Any:
        return self._wrapped[name]


async def test_a_database_handed_out_by_subscript_works(mock_client: MockClient):
    """mongomock's `with_options` returns its synchronous database: the store asks the async client instead."""
    store = MongoStepStore(client=_SubscriptOnly(mock_client), database='x')
    assert is_mongomock(store.database)
    assert not is_synchronous_mongomock(store.database)
    started = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    await store.register_run(RunRecord(run_id='r1', started_at=started, metadata={'k': 'v'}))
    run = await store.get_run('r1')
    assert run is not None
    assert (run.started_at, run.metadata) == (started, {'k': 'v'})
    assert await mock_client['x']['runs'].count_documents({'_id': 'r1'}) == 1


async def test_dates_read_back_aware_in_utc(mock_client: MockClient):
    """The store's codec options reach mongomock when the store is the first to ask for the database."""
    store = MongoStepStore(client=mock_client, database='x')
    started = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    await store.register_run(RunRecord(run_id='r1', started_at=started))
    doc: Document | None = await store.database['runs'].find_one({'_id': 'r1'})
    assert doc is not None
    assert doc['started_at'].utcoffset() == timedelta(0)
    assert doc['started_at'] == started.replace(microsecond=123000)  # BSON dates hold milliseconds
    run = await store.get_run('r1')
    assert run is not None
    assert run.started_at == started


async def test_records_are_exact_when_the_application_used_the_database_first(mock_client: MockClient):
    """mongomock keeps a database's codec options from its first use, so raw documents of a database the
    application used before the store read dates naive. The records do not depend on that: their
    times come from the JSON body and the microsecond twins."""
    await mock_client['x']['other'].insert_one({'a': 1})
    store = MongoStepStore(client=mock_client, database='x')
    started = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    await store.register_run(RunRecord(run_id='r1', started_at=started))
    await store.register_run(RunRecord(run_id='r2', started_at=started + timedelta(microseconds=1)))
    doc: Document | None = await store.database['runs'].find_one({'_id': 'r1'})
    assert doc is not None
    assert doc['started_at'].tzinfo is None  # mongomock: the codec options of the first use
    assert [(r.run_id, r.started_at) for r in await store.list_runs(newest_first=True)] == [
        ('r2', started + timedelta(microseconds=1)),
        ('r1', started),
    ]
    [later] = await store.list_runs(started_after=started)
    assert later.run_id == 'r2'


async def test_a_given_mock_client_stays_open(mock_client: MockClient):
    store = MongoStepStore(client=mock_client, database='x')
    await store.register_run(RunRecord(run_id='r1'))
    await store.aclose()
    assert isinstance(store.media_store, MongoMediaStore)
    await store.media_store.aclose()
    again = MongoStepStore(client=mock_client, database='x')
    assert [r.run_id for r in await again.list_runs()] == ['r1']
    await mock_client.drop_database('x')
    assert await again.list_runs() == []


def test_mongomock_synchronous_client_is_refused():
    with pytest.raises(
        TypeError, match=r'synchronous MongoClient as client=: .* mongomock_motor\.AsyncMongoMockClient'
    ):
        MongoStepStore(client=mongomock.MongoClient())  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match='synchronous MongoClient as client='):
        MongoMediaStore(client=mongomock.MongoClient())  # pyright: ignore[reportArgumentType]


async def test_only_mongomock_takes_the_adapted_paths(mock_client: MockClient):
    """The adaptations apply to mongomock-motor's objects and never to pymongo's."""
    real: AsyncMongoClient[Document] = AsyncMongoClient('mongodb://127.0.0.1:1', connect=False)
    try:
        for obj in (real, real['x'], real['x']['runs']):
            assert not is_mongomock(obj)
            assert not is_synchronous_mongomock(obj)
    finally:
        await real.close()
    for obj in (mock_client, mock_client['x'], mock_client['x']['runs']):
        assert is_mongomock(obj)
        assert not is_synchronous_mongomock(obj)
    sync = mongomock.MongoClient()
    for obj in (sync, sync['x'], sync['x']['runs']):
        assert not is_mongomock(obj)
        assert is_synchronous_mongomock(obj)


@pytest.mark.parametrize('store_class', [MongoStepStore, MongoMediaStore], ids=lambda c: c.__name__)
def test_exactly_one_of_client_and_db_url(
    store_class: type[MongoStepStore] | type[MongoMediaStore], mock_client: MockClient
):
    with pytest.raises(ValueError, match='exactly one of client= or db_url=, not both'):
        store_class(client=mock_client, db_url='mongodb://127.0.0.1:27017')
    with pytest.raises(ValueError, match='exactly one of client= or db_url=, got neither'):
        store_class()
