"""Run leases in MongoDB: the lease document and its index, the server's clock, fenced writes as
transactions (started again after a transient conflict), and the read fence where a server has no
transactions.

The tests of transactions need a server that runs them (a replica set, or mongoeco); against a
standalone `mongod` they are skipped, saying so, and the read fence is tested instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from pymongo import AsyncMongoClient
from pymongo import MongoClient as SyncMongoClient
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import OperationFailure, PyMongoError
from pymongo.monitoring import CommandFailedEvent, CommandListener, CommandStartedEvent, CommandSucceededEvent

from step_mongo.client import Document, MongoClient
from step_mongo.store import MongoPort, MongoStepStore
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.engine import DamagedRecordError, ops
from stepcore.engine.faults import inject_faults
from stepcore.ownership import claim_run, open_lease
from stepcore.store.leases import Fence, LeaseState, Owner, RunFencedError, RunOwnedError, fencing

T0 = datetime(2026, 1, 1, tzinfo=UTC)
START: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('start here', timestamp=T0)])]


class Commands(CommandListener):
    """The commands a client sends, by name, with their bodies."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def started(self, event: CommandStartedEvent) -> None:
        if event.command_name not in ('hello', 'isMaster', 'ismaster', 'endSessions'):
            self.sent.append((event.command_name, dict(event.command)))

    def succeeded(self, event: CommandSucceededEvent) -> None:
        pass

    def failed(self, event: CommandFailedEvent) -> None:
        pass

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        sent, self.sent = self.sent, []
        return sent


@pytest.fixture
async def store(mongo_client: MongoClient, db_name: str) -> AsyncIterator[MongoStepStore]:
    s = MongoStepStore(client=mongo_client, database=db_name)
    yield s
    await s.aclose()


@pytest.fixture
async def transactions(mongo_client: MongoClient, db_name: str) -> bool:
    """Whether the server at STEP_MONGO_URL runs transactions (False: a standalone server, which
    refuses them with code 20)."""
    probe = mongo_client[db_name]['transaction_probe']
    await probe.insert_one({'_id': 1})
    async with mongo_client.start_session() as session:
        try:
            await session.start_transaction()
            await probe.update_one({'_id': 1}, {'$set': {'probed': True}}, session=session)
        except OperationFailure as error:
            if error.code == 20:
                return False
            raise
        await session.abort_transaction()
    await probe.drop()
    return True


def _needs_transactions(transactions: bool) -> None:
    if not transactions:
        pytest.skip(
            'the server at STEP_MONGO_URL has no transactions (a standalone mongod): fenced writes are '
            'fenced by a read there, tested by test_without_transactions_the_fence_is_a_read_before_the_writes'
        )


def _stranger() -> Owner:
    return Owner(host='another-host.invalid', pid=4242, token='t-stranger')


def _event(run_id: str, n: int) -> StepEvent:
    return StepEvent(run_id=run_id, kind=EventKind.MODEL_REQUEST_STARTED, step_index=n, timestamp=T0)


def _effect(run_id: str, call: str) -> ToolEffectRecord:
    return ToolEffectRecord(
        run_id=run_id, tool_call_id=call, tool_name='t', status=ToolEffectStatus.STARTED, started_at=T0
    )


def _snapshot(run_id: str, step: int) -> ContinuableSnapshot:
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(f'prompt {n}', timestamp=T0)]) for n in range(step + 1)
    ]
    return ContinuableSnapshot(run_id=run_id, step_index=step, messages=messages)


async def _leased(store: MongoStepStore, run_id: str, *, ttl: float = 60.0) -> Fence:
    await store.register_run(RunRecord(run_id=run_id))
    lease = await open_lease(store, run_id, ttl=ttl, owner=_stranger())
    return Fence(run_id, lease.epoch)


def _port(store: MongoStepStore) -> MongoPort:
    port = store.port
    assert isinstance(port, MongoPort)
    return port


async def _lease_doc(client: MongoClient, db_name: str, run_id: str) -> Document:
    doc: Document | None = await client[db_name]['run_leases'].find_one({'_id': run_id})
    assert doc is not None
    return doc


async def _server_now(client: MongoClient) -> datetime:
    hello: Document = await client.admin.command('hello')
    return hello['localTime'].replace(tzinfo=UTC)


def _fail_first_commit(
    monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], Awaitable[None]] | None = None
) -> list[int]:
    """Make the first commit of a fenced write fail as a transient conflict: its transaction is
    dropped, then `meanwhile()` runs, then the commit raises. Answers the count of commits tried."""
    real_commit = AsyncClientSession.commit_transaction
    tried: list[int] = []

    async def commit(self: AsyncClientSession) -> None:
        tried.append(1)
        if len(tried) > 1:
            return await real_commit(self)
        await self.abort_transaction()
        if meanwhile is not None:
            await meanwhile()
        raise OperationFailure(
            'WriteConflict (simulated)', 112, {'ok': 0, 'code': 112, 'errorLabels': ['TransientTransactionError']}
        )

    monkeypatch.setattr(AsyncClientSession, 'commit_transaction', commit)
    return tried


# -- the document, its index, the clock -------------------------------------------------------


async def test_a_lease_is_one_document_indexed_by_state(store: MongoStepStore, mongo_client: MongoClient, db_name: str):
    run_id = 'leased-1'
    await store.register_run(RunRecord(run_id=run_id))
    lease = await open_lease(store, run_id, ttl=60.0, start=START)
    assert lease.owner is not None
    doc = await _lease_doc(mongo_client, db_name, run_id)
    assert set(doc) == {'_id', 'epoch', 'state', 'host', 'expires', 'body', 'start'}
    assert (doc['epoch'], doc['state'], doc['host']) == (1, 'running', lease.owner.host)
    assert isinstance(doc['body'], str)
    assert isinstance(doc['start'], bytes)
    assert doc['expires'].replace(tzinfo=UTC) == lease.expires_at  # a BSON date, as answered
    assert lease.seconds_left == 60.0
    indexes = await mongo_client[db_name]['run_leases'].index_information()
    assert indexes['state']['key'] == [('state', 1)]
    assert await store.lease_start(run_id) == START

    # a swap without `start` keeps the start point; one that does not match changes nothing
    claim = await claim_run(store, run_id, ttl=60.0, force=True)
    assert claim.epoch == 2
    assert await store.lease_start(run_id) == START
    before = await _lease_doc(mongo_client, db_name, run_id)
    swapped, now = await store.swap_lease(claim.lease, expect=1, ttl=60.0)
    assert not swapped
    assert now is not None
    assert now.epoch == 2
    assert await _lease_doc(mongo_client, db_name, run_id) == before


async def test_every_time_is_the_servers(
    store: MongoStepStore, mongo_client: MongoClient, monkeypatch: pytest.MonkeyPatch
):
    """With this process's clock a day ahead, leases still live and expire by the server's clock."""
    server = await _server_now(mongo_client)
    day = 86_400
    real_time, real_ns = time.time, time.time_ns
    monkeypatch.setattr(time, 'time', lambda: real_time() + day)
    monkeypatch.setattr(time, 'time_ns', lambda: real_ns() + day * 1_000_000_000)
    await _leased(store, 'live')
    live = await store.get_lease('live')
    assert live is not None
    assert not live.expired
    assert abs((live.checked_at - server).total_seconds()) < 30
    with pytest.raises(RunOwnedError):
        await claim_run(store, 'live', ttl=60.0)
    await _leased(store, 'short', ttl=0.05)
    await asyncio.sleep(0.1)
    claim = await claim_run(store, 'short', ttl=60.0)
    assert claim.epoch == 2
    assert {x.run_id for x in await store.list_leases([LeaseState.RUNNING])} == {'live', 'short'}
    _, now = await _port(store).list_leases(None, ops.ListLeases(('waiting',)))
    assert abs(now - server.timestamp()) < 30, 'the clock of an empty listing is the server, too'


async def test_a_damaged_lease_is_reported_and_skipped_in_listings(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str, caplog: pytest.LogCaptureFixture
):
    await _leased(store, 'good')
    await _leased(store, 'bad')
    await mongo_client[db_name]['run_leases'].update_one({'_id': 'bad'}, {'$set': {'body': '{not json'}})
    with pytest.raises(DamagedRecordError, match="'bad'"):
        await store.get_lease('bad')
    await mongo_client[db_name]['run_leases'].update_one({'_id': 'good'}, {'$set': {'expires': 'soon'}})
    with caplog.at_level(logging.WARNING):
        assert await store.list_leases([LeaseState.RUNNING]) == []
    assert 'bad' in caplog.text
    assert 'good' in caplog.text


# -- fenced writes ----------------------------------------------------------------------------


async def test_a_fenced_write_is_one_transaction_that_writes_the_lease(
    mongo_url: str, db_name: str, transactions: bool
):
    """Two statements more than the same write unfenced: the fence (an update of the lease
    document) and the commit; the unfenced write stays as it was, with no session. Without
    transactions, one statement more: the read of the lease."""
    listener = Commands()
    client: MongoClient = AsyncMongoClient[Any](mongo_url, event_listeners=[listener])
    store = MongoStepStore(client=client, database=db_name)
    try:
        fence = await _leased(store, 'r1')
        listener.take()
        await store.append_event(_event('r1', 1))
        unfenced = listener.take()
        assert [name for name, _ in unfenced] == ['findAndModify', 'insert']
        assert not any('txnNumber' in body for _, body in unfenced)
        with fencing(fence):
            await store.append_event(_event('r1', 2))
        fenced = listener.take()
        if not transactions:
            # the first fenced write found out (the server refused its transaction); the next read the lease
            assert _port(store).transactions is False
            with fencing(fence):
                await store.append_event(_event('r1', 3))
            assert [name for name, _ in listener.take()] == ['find', 'findAndModify', 'insert']
            return
        assert [name for name, _ in fenced] == ['update', 'findAndModify', 'insert', 'commitTransaction']
        assert fenced[0][1]['updates'][0]['q'] == {'_id': 'r1', 'epoch': 1}
        assert fenced[0][1].get('startTransaction') is True
        assert len({body['txnNumber'] for _, body in fenced}) == 1
        assert _port(store).transactions is True
        assert (await _lease_doc(client, db_name, 'r1'))['fenced_writes'] == 1
        assert [e.step_index for e in await store.list_events('r1')] == [1, 2]
    finally:
        await store.aclose()
        await client.close()


async def test_a_transaction_stopped_by_a_conflict_is_made_again_once(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch, transactions: bool
):
    _needs_transactions(transactions)
    fence = await _leased(store, 'r1')
    tried = _fail_first_commit(monkeypatch)
    with fencing(fence):
        await store.write_batch([_effect('r1', 'c1'), _event('r1', 1), _event('r1', 2)], snapshot=_snapshot('r1', 1))
    assert len(tried) == 2
    assert [(e.seq, e.step_index) for e in await store.list_events('r1')] == [(1, 1), (2, 2)]
    assert [e.tool_call_id for e in await store.list_tool_effects('r1')] == ['c1']
    assert [s.seq for s in await store.list_snapshots('r1')] == [1]
    assert await mongo_client[db_name]['message_nodes'].count_documents({'run_id': 'r1'}) == 2
    assert (await _lease_doc(mongo_client, db_name, 'r1'))['fenced_writes'] == 1


async def test_a_takeover_before_the_commit_refuses_the_write(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch, transactions: bool
):
    _needs_transactions(transactions)
    fence = await _leased(store, 'r1')
    other = MongoStepStore(client=mongo_client, database=db_name)

    async def take_over() -> None:
        await claim_run(other, 'r1', ttl=60.0, force=True)

    tried = _fail_first_commit(monkeypatch, take_over)
    with fencing(fence), pytest.raises(RunFencedError) as refused:
        await store.write_batch([_effect('r1', 'c1'), _event('r1', 1)], snapshot=_snapshot('r1', 1))
    assert len(tried) == 1
    assert refused.value.lease is not None
    assert refused.value.lease.epoch == 2
    assert await store.list_events('r1') == []
    assert await store.list_tool_effects('r1') == []
    assert await store.list_snapshots('r1', include_interrupted=True) == []
    assert 'fenced_writes' not in await _lease_doc(mongo_client, db_name, 'r1')
    await other.aclose()


async def test_a_takeover_racing_an_open_transaction_either_waits_for_it_or_refuses_it(
    store: MongoStepStore, mongo_url: str, db_name: str, transactions: bool
):
    """A takeover made while a fenced write's transaction is open, after its writes: MongoDB makes
    the takeover wait for the transaction (it holds the lease document), mongoeco lets it commit and
    fails the transaction's commit. Either way the write and the takeover do not both count."""
    _needs_transactions(transactions)
    fence = await _leased(store, 'r1')
    sync: SyncMongoClient[Document] = SyncMongoClient(mongo_url)
    took_over: list[bool] = []

    def hook(boundary: str) -> None:
        if boundary != 'commit' or took_over:
            return
        try:  # blocks the event loop: the transaction stays open meanwhile
            done = sync[db_name].command(
                'update',
                'run_leases',
                updates=[{'q': {'_id': 'r1', 'epoch': 1}, 'u': {'$set': {'epoch': 2}}}],
                maxTimeMS=2000,
            )
            took_over.append(done.get('nModified') == 1)
        except PyMongoError:
            took_over.append(False)

    try:
        with inject_faults(store, hook), fencing(fence):
            try:
                await store.append_event(_event('r1', 1))
                refused = False
            except RunFencedError:
                refused = True
    finally:
        sync.close()
    assert took_over == [refused]
    events = await store.list_events('r1')
    assert len(events) == (0 if refused else 1)
    lease = await store.get_lease('r1')
    assert lease is not None
    assert lease.epoch == (2 if refused else 1)


async def test_an_operation_answering_otherwise_when_made_again_runs_the_plan_again(
    mongo_client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch, transactions: bool
):
    """Retention read the snapshots before the conflict; another save came in meanwhile: the plan
    runs again on what is there now, so the kept snapshots are still at most two."""
    _needs_transactions(transactions)
    store = MongoStepStore(client=mongo_client, database=db_name, max_snapshots_per_run=2)
    interloper = MongoStepStore(client=mongo_client, database=db_name)
    fence = await _leased(store, 'r1')
    with fencing(fence):
        await store.save_snapshot(_snapshot('r1', 1))

    async def another_save() -> None:
        # another writer, unfenced (a task of its own, outside this task's fence)
        await asyncio.create_task(interloper.save_snapshot(_snapshot('r1', 2)), context=contextvars.Context())

    tried = _fail_first_commit(monkeypatch, another_save)
    with fencing(fence):
        await store.save_snapshot(_snapshot('r1', 3))
    assert len(tried) == 2
    assert [s.step_index for s in await store.list_snapshots('r1')] == [2, 3]
    assert (await _lease_doc(mongo_client, db_name, 'r1'))['fenced_writes'] == 2
    await interloper.aclose()
    await store.aclose()


async def test_without_transactions_the_fence_is_a_read_before_the_writes(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str, monkeypatch: pytest.MonkeyPatch
):
    """A standalone server refuses the transaction (code 20): the store finds out once and fences
    every write by reading the lease just before it."""
    refusals: list[int] = []

    async def refuse(self: AsyncClientSession, *args: Any, **kwargs: Any) -> None:
        refusals.append(1)
        raise OperationFailure('Transaction numbers are only allowed on a replica set member or mongos', 20)

    monkeypatch.setattr(AsyncClientSession, 'start_transaction', refuse)
    fence = await _leased(store, 'r1')
    with fencing(fence):
        await store.append_event(_event('r1', 1))
        await store.write_batch([_effect('r1', 'c1'), _event('r1', 2)], snapshot=_snapshot('r1', 1))
    assert _port(store).transactions is False
    assert refusals == [1]
    assert [e.step_index for e in await store.list_events('r1')] == [1, 2]
    await claim_run(store, 'r1', ttl=60.0, force=True)
    with fencing(fence), pytest.raises(RunFencedError):
        await store.append_event(_event('r1', 3))
    assert [e.step_index for e in await store.list_events('r1')] == [1, 2]
    assert 'fenced_writes' not in await _lease_doc(mongo_client, db_name, 'r1')
