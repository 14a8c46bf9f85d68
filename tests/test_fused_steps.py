"""A step's write sent whole (`WriteStep`) to the ports that fuse it stores exactly what the same
write stores one operation at a time, and a port subclass that changes one of those operations is
sent them one at a time, so its change holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_sqlite import SqliteStepStore
from step_sqlite.store import SqlitePort
from stepcore import (
    ContinuableSnapshot,
    InMemoryStepStore,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.backend import EngineStore, ops
from stepcore.engine.memory import MemoryPort
from stepcore.store.models import EventKind


class OneByOneMemory(MemoryPort):
    fused_steps = False


class OneByOneSqlite(SqlitePort):
    fused_steps = False


class CountingEvents(MemoryPort):
    """Changes how events are stored (counts them): a step's write must reach this `put_events`."""

    def __init__(self) -> None:
        super().__init__()
        self.events_put = 0

    def put_events(self, tx: Any, op: ops.PutEvents) -> None:
        self.events_put += len(op.rows)
        super().put_events(tx, op)


def _history(n: int) -> list[ModelMessage]:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    for i in range(n):
        messages += [ModelResponse(parts=[TextPart(f'answer {i}')]), ModelRequest(parts=[UserPromptPart(f'more {i}')])]
    return messages


HISTORIES = [_history(i) if i != 4 else [ModelRequest(parts=[UserPromptPart('compacted')])] for i in range(6)]
"""The histories the steps save (built once: both stores of a comparison get the very same messages)."""


async def _steps(store: EngineStore) -> None:
    """A run's writes: snapshots under retention (one repeated by its key, one rewriting the history),
    ledger entries and events, with and without a snapshot."""
    await store.register_run(RunRecord(run_id='r'))
    for i in range(6):
        state = SnapshotState.COMPLETE if i % 2 else SnapshotState.INTERRUPTED
        snapshot = ContinuableSnapshot(
            run_id='r', step_index=i, state=state, messages=HISTORIES[i], idempotency_key=f'snap-{min(i, 2)}'
        )
        records = [
            ToolEffectRecord(run_id='r', tool_call_id=f'c{i}', tool_name='t', status=ToolEffectStatus.STARTED),
            StepEvent(run_id='r', kind=EventKind.TOOL_CALL_STARTED, step_index=i, idempotency_key=f'e{i}'),
        ]
        await store.write_step('r', records, snapshot)
        await store.write_step(
            'r', [StepEvent(run_id='r', kind=EventKind.MODEL_REQUEST_STARTED, step_index=i, idempotency_key=f'm{i}')]
        )


async def _stored(store: EngineStore) -> tuple[Any, ...]:
    snapshots = await store.list_snapshots(run_id='r', include_interrupted=True)
    events = await store.list_events('r')
    effects = await store.list_tool_effects('r')
    return (
        [(s.seq, s.state, s.step_index, s.messages) for s in snapshots],
        [(e.seq, e.kind, e.step_index, e.idempotency_key) for e in events],
        sorted((e.tool_call_id, e.status) for e in effects),
    )


def _memory(port: MemoryPort) -> InMemoryStepStore:
    store = InMemoryStepStore(max_snapshots_per_run=2)
    store.port = port
    return store


async def test_memory_stores_the_same_whole_or_one_operation_at_a_time() -> None:
    whole, one_by_one = _memory(MemoryPort()), _memory(OneByOneMemory())
    assert whole.port.fused_steps
    assert not one_by_one.port.fused_steps
    await _steps(whole)
    await _steps(one_by_one)
    assert await _stored(whole) == await _stored(one_by_one)


async def test_sqlite_stores_the_same_whole_or_one_operation_at_a_time(tmp_path: Path) -> None:
    whole = SqliteStepStore(database=tmp_path / 'whole.db', max_snapshots_per_run=2)
    one_by_one = SqliteStepStore(database=tmp_path / 'one.db', max_snapshots_per_run=2)
    one_by_one.port.__class__ = OneByOneSqlite
    try:
        await _steps(whole)
        await _steps(one_by_one)
        found = await _stored(whole)
        assert found == await _stored(one_by_one)
        snapshots, events, effects = found
        assert len(snapshots) == 2
        assert len(events) == 12
        assert len(effects) == 6
    finally:
        await whole.aclose()
        await one_by_one.aclose()


@pytest.mark.parametrize('port', [MemoryPort(), CountingEvents()], ids=['fused', 'subclass'])
async def test_a_subclass_changing_an_operation_gets_it_called(port: MemoryPort) -> None:
    store = _memory(port)
    await _steps(store)
    if isinstance(port, CountingEvents):
        assert port.events_put == 12
    assert len((await _stored(store))[1]) == 12
