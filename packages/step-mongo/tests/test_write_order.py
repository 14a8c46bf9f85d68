"""Writes without transactions: their order, a write stopped between two of them, and racing writers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

from step_mongo.client import MongoClient
from step_mongo.store import MongoPort, MongoStepStore
from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.engine import KeyConflict
from stepcore.engine._ops import PutSnapshot, SnapshotRow
from stepcore.engine.faults import InjectedFault, boundaries, inject_faults, stop_at

WRITE_ORDER = [
    'put_snapshot',
    'put_snapshot:nodes',
    'put_snapshot:row',
    'put_effects',
    'put_events',
    'commit',
    'committed',
]


@pytest.fixture
async def store(mongo_client: MongoClient, db_name: str) -> AsyncIterator[MongoStepStore]:
    store = MongoStepStore(client=mongo_client, database=db_name)
    yield store
    await store.aclose()


def _tool_step(store: MongoStepStore, run_id: str) -> Callable[[], Awaitable[None]]:
    """The batch that settles tool call c1: its result in a snapshot, the ledger entry, the event."""
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart('go')]),
        ModelResponse(parts=[ToolCallPart('t', {'x': 1}, tool_call_id='c1')]),
        ModelRequest(parts=[ToolReturnPart('t', 'done', tool_call_id='c1')]),
    ]
    effect = ToolEffectRecord(run_id=run_id, tool_call_id='c1', tool_name='t', status=ToolEffectStatus.COMPLETED)
    event = StepEvent(
        run_id=run_id, kind=EventKind.TOOL_CALL_COMPLETED, tool_call_id='c1', idempotency_key='e-c1', step_index=0
    )
    snapshot = ContinuableSnapshot(run_id=run_id, step_index=1, messages=messages, idempotency_key='s-c1')
    return lambda: store.write_batch([effect, event], snapshot=snapshot)


async def _start_call(store: MongoStepStore, run_id: str) -> None:
    await store.register_run(RunRecord(run_id=run_id))
    await store.record_tool_effect(
        ToolEffectRecord(run_id=run_id, tool_call_id='c1', tool_name='t', status=ToolEffectStatus.STARTED)
    )


def _returned(snapshot: ContinuableSnapshot | None) -> bool:
    return snapshot is not None and any(
        isinstance(part, ToolReturnPart) and part.tool_call_id == 'c1'
        for message in snapshot.messages
        for part in message.parts
    )


async def test_a_batch_writes_snapshot_then_ledger_then_events(store: MongoStepStore):
    await _start_call(store, 'probe')
    assert await boundaries(store, _tool_step(store, 'probe')) == WRITE_ORDER


@pytest.mark.parametrize('stop', range(len(WRITE_ORDER) - 1))
async def test_a_batch_stopped_between_writes_keeps_the_crash_rule_and_a_retry_completes_it(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str, stop: int
):
    await _start_call(store, 'r1')
    with inject_faults(store, stop_at(stop)), pytest.raises(InjectedFault, match=WRITE_ORDER[stop]):
        await _tool_step(store, 'r1')()

    # as a new process finds it
    after = MongoStepStore(client=mongo_client, database=db_name)
    effect = await after.get_tool_effect('r1', 'c1')
    assert effect is not None
    latest = await after.latest_snapshot('r1')
    if effect.status is ToolEffectStatus.COMPLETED:
        assert _returned(latest)
    else:
        assert [e.tool_call_id for e in await after.list_unresolved_tool_effects('r1')] == ['c1']
    assert (effect.status is ToolEffectStatus.COMPLETED) == (stop > WRITE_ORDER.index('put_effects'))

    await _tool_step(after, 'r1')()  # the retry of a recovering process
    assert [s.seq for s in await after.list_snapshots('r1', include_interrupted=True)] == [1]
    assert _returned(await after.latest_snapshot('r1'))
    assert [e.idempotency_key for e in await after.list_events('r1')] == ['e-c1']
    assert await after.list_unresolved_tool_effects('r1') == []


def _row(run_id: str) -> SnapshotRow:
    return SnapshotRow(run_id=run_id, state='complete', head=None, length=1, body=b'{"format":1}')


async def test_put_snapshot_raises_key_conflict_when_the_key_was_recorded_meanwhile(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str
):
    snapshots = mongo_client[db_name]['snapshots']
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', idempotency_key='k', step_index=0, messages=[]))
    late = PutSnapshot('r1', 'k', None, [b'{}'], _row('r1'))
    port = store.port
    assert isinstance(port, MongoPort)
    async with port.transaction(['r1']) as tx:
        with pytest.raises(KeyConflict):
            await port.run(tx, late)  # breaks the snapshots' unique key index
    assert await snapshots.count_documents({'run_id': 'r1'}) == 1

    await snapshots.delete_many({'run_id': 'r1'})  # pruned: only the key document records the key
    async with port.transaction(['r1']) as tx:
        with pytest.raises(KeyConflict):
            await port.run(tx, late)  # breaks the key documents' unique _id
    assert await snapshots.count_documents({'run_id': 'r1'}) == 0  # its snapshot document did not stay


async def test_racing_writers_in_two_stores_apply_each_key_once(
    store: MongoStepStore, mongo_client: MongoClient, db_name: str
):
    other = MongoStepStore(client=mongo_client, database=db_name)
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hi')])]
    writes: list[Awaitable[Any]] = []
    for s in (store, other) * 4:
        writes.append(
            s.save_snapshot(ContinuableSnapshot(run_id='r1', messages=messages, idempotency_key='s', step_index=0))
        )
        writes.append(
            s.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, idempotency_key='e', step_index=0))
        )
        writes.append(s.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_COMPLETED, step_index=0)))
    await asyncio.gather(*writes)
    assert [s.idempotency_key for s in await store.list_snapshots('r1', include_interrupted=True)] == ['s']
    events = await store.list_events('r1')
    assert [e.kind for e in events].count(EventKind.RUN_STARTED) == 1
    assert [e.kind for e in events].count(EventKind.RUN_COMPLETED) == 8
    seqs = [e.seq or 0 for e in events]
    assert seqs == sorted(set(seqs))
