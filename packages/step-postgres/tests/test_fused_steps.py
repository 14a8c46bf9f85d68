"""A step's write in one call (`PostgresPort.write_step`, `fused_steps`): every step of an agent run
goes to the port whole, and stores the same rows and fails the same way as the engine's operations
sent one at a time (the plan path, which a store built while `fused_steps` is false takes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, LiteralString
from unittest.mock import patch

import psycopg
import pytest
from psycopg import errors
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_postgres import PostgresStepStore
from step_postgres.schema import Tables
from step_postgres.store import PostgresPort
from stepcore import ContinuableSnapshot, EventKind, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.capability import StepPersistence
from stepcore.engine._plans import StaleHistory
from stepcore.ownership import open_lease
from stepcore.store.leases import Fence, RunFencedError, fencing

STEP_WRITES = ('check_lease', 'put_snapshot', 'delete_snapshots', 'put_effects', 'put_events')
"""The port's methods for the operations a step's write (`ops.WriteStep`) stands for, besides its reads."""
STEP_READS = frozenset({'snapshot_key_applied', 'node_exists'})
"""Its reads that no other part of the engine sends (`snapshot_states` is also read to tally a run)."""

Stored = dict[str, Any]


class _Spy:
    """Records how a step reaches the port: whole (`write_step`, and what it raised), or as its
    operations (each call of their methods, and each of their reads the engine sends)."""

    def __init__(self, store: PostgresStepStore) -> None:
        port = store.port
        assert isinstance(port, PostgresPort)
        self.steps = 0
        self.raised: list[type[BaseException]] = []
        self.operations: Counter[str] = Counter()
        run_group, write_step = port.run_group, port.write_step

        async def spy_run_group(tx: Any, group: Sequence[Any]) -> list[Any]:
            self.operations.update(op.method for op in group if op.method in STEP_READS)
            return await run_group(tx, group)

        async def spy_write_step(tx: Any, op: Any) -> Any:
            self.steps += 1
            try:
                return await write_step(tx, op)
            except BaseException as error:
                self.raised.append(type(error))
                raise

        port.run_group = spy_run_group  # pyright: ignore[reportAttributeAccessIssue]
        port.write_step = spy_write_step  # pyright: ignore[reportAttributeAccessIssue]
        for name in STEP_WRITES:
            setattr(port, name, self._counted(name, getattr(port, name)))

    def _counted(self, name: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def spy(tx: Any, op: Any) -> Any:
            self.operations[name] += 1
            return await method(tx, op)

        return spy

    @property
    def step_operations(self) -> set[str]:
        return set(self.operations)


def _store(url: str, prefix: str, *, fused: bool, **options: Any) -> tuple[PostgresStepStore, _Spy]:
    """A store on `prefix` whose driver sends steps whole (`fused`) or one operation at a time."""
    with patch.object(PostgresPort, 'fused_steps', fused):  # read when the store's driver is built
        store = PostgresStepStore(dsn=url, table_prefix=prefix, **options)
    return store, _Spy(store)


def _count(url: str, prefix: str, template: LiteralString, run_id: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(Tables(prefix).query(template), (run_id,)).fetchone()
    assert row is not None
    return int(row[0])


async def _stored(store: PostgresStepStore, url: str, run_id: str) -> Stored:
    """What the store holds of the run, without what differs between two runs of the same steps
    (timestamps, node ids): of a snapshot, its number of messages."""
    prefix = store.table_prefix
    return {
        'events': [(e.seq, e.kind, e.step_index, e.tool_call_id) for e in await store.list_events(run_id)],
        'effects': [(e.tool_call_id, e.status) for e in await store.list_tool_effects(run_id)],
        'snapshots': [
            (s.seq, s.state, s.step_index, len(s.messages))
            for s in await store.list_snapshots(run_id, include_interrupted=True)
        ],
        'nodes': _count(url, prefix, 'SELECT count(*) FROM {nodes} WHERE run_id = %s', run_id),
        'keys': _count(url, prefix, 'SELECT count(*) FROM {snapshot_keys} WHERE run_id = %s', run_id),
    }


Scenario = Callable[[Callable[..., PostgresStepStore]], Awaitable[Stored]]
"""Writes through the stores it opens with the function it is given; answers what they stored."""


async def _on_path(url: str, prefix: str, scenario: Scenario, *, fused: bool) -> tuple[Stored, list[_Spy]]:
    """`scenario` with stores on `prefix` that take one path: what it stored, and the stores' spies."""
    opened: list[tuple[PostgresStepStore, _Spy]] = []

    def open_store(**options: Any) -> PostgresStepStore:
        opened.append(_store(url, prefix, fused=fused, **options))
        return opened[-1][0]

    try:
        return await scenario(open_store), [spy for _, spy in opened]
    finally:
        for store, _ in opened:
            await store.aclose()


async def _on_both_paths(
    url: str, new_prefix: Callable[[], str], scenario: Scenario
) -> tuple[Stored, list[_Spy], list[_Spy]]:
    """`scenario` on the fused path and on the plan path, each under a prefix of its own: what it
    stored (the same on both) and the spies of the stores of each path."""
    fused_stored, fused = await _on_path(url, new_prefix(), scenario, fused=True)
    plan_stored, plan = await _on_path(url, new_prefix(), scenario, fused=False)
    assert fused_stored == plan_stored
    return fused_stored, fused, plan


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    calls = sum(1 for m in messages if isinstance(m, ModelResponse))
    if calls < 4:
        return ModelResponse(parts=[ToolCallPart('double', {'n': calls}, tool_call_id=f'call-{calls}')])
    return ModelResponse(parts=[TextPart('done')])


async def test_every_step_of_an_agent_run_is_one_call_storing_what_the_operations_store(
    postgres_url: str, new_prefix: Callable[[], str]
) -> None:
    async def scenario(open_store: Callable[..., PostgresStepStore]) -> Stored:
        store = open_store(max_snapshots_per_run=2)  # pruning too
        agent = Agent(FunctionModel(_model), capabilities=[StepPersistence(store=store, run_id='run-1')])

        @agent.tool_plain
        def double(n: int) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'{2 * n} ' + 'x' * 500

        result = await agent.run('double 0 to 3')
        latest = await store.latest_snapshot('run-1')
        assert latest is not None
        assert latest.messages == result.all_messages()
        return await _stored(store, postgres_url, 'run-1')

    stored, (fused,), (plan,) = await _on_both_paths(postgres_url, new_prefix, scenario)
    assert stored['snapshots'][0][0] > 1  # the oldest were pruned
    assert [(e[0], e[1]) for e in stored['effects']] == [(f'call-{n}', ToolEffectStatus.COMPLETED) for n in range(4)]
    assert fused.steps >= 8, fused.steps  # two writes a step
    assert fused.step_operations == set(), fused.operations
    assert fused.raised == []
    assert plan.steps == 0
    assert plan.step_operations == {*STEP_WRITES, *STEP_READS}


def _history(n: int) -> list[ModelMessage]:
    """A prompt and `n` tool exchanges."""
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    for i in range(n):
        messages += [
            ModelResponse(parts=[ToolCallPart('lookup', {'i': i}, tool_call_id=f'call-{i}')]),
            ModelRequest(parts=[ToolReturnPart('lookup', f'result {i}', tool_call_id=f'call-{i}')]),
        ]
    return messages


HISTORY = _history(3)
"""One history for every save (its messages' timestamps are fixed): step `n` saves its first `2n + 3`."""


def _records(run_id: str, step: int) -> list[StepEvent | ToolEffectRecord]:
    call = f'call-{step}'
    return [
        ToolEffectRecord(run_id=run_id, tool_call_id=call, tool_name='lookup', status=ToolEffectStatus.COMPLETED),
        StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_COMPLETED, tool_call_id=call, step_index=step),
    ]


def _save(run_id: str, step: int, key: str | None) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id=run_id, messages=HISTORY[: 2 * step + 3], step_index=step, idempotency_key=key)


async def test_a_fenced_step_fails_as_on_the_plan_path_and_stores_nothing(
    postgres_url: str, new_prefix: Callable[[], str]
) -> None:
    """Refused with a snapshot (its checks answered with the fence's failure), with a snapshot whose
    node ids need a refill sent beside its checks (a store object's first save), and without one."""

    async def scenario(open_store: Callable[..., PostgresStepStore]) -> Stored:
        store = open_store()
        lease = await open_lease(store, 'r', ttl=60.0)
        with fencing(Fence('r', lease.epoch)):
            await store.write_batch(_records('r', 0), snapshot=_save('r', 0, 'k0'))
        swapped, _ = await store.swap_lease(replace(lease, epoch=lease.epoch + 1), expect=lease.epoch, ttl=60.0)
        assert swapped
        fresh = open_store()  # no node ids in hand: its save takes a block first
        for writer, snapshot in ((store, _save('r', 1, 'k1')), (fresh, _save('r', 1, 'k1')), (store, None)):
            with fencing(Fence('r', lease.epoch)), pytest.raises(RunFencedError, match='taken over'):
                await writer.write_batch(_records('r', 1), snapshot=snapshot)
        return await _stored(store, postgres_url, 'r')

    stored, fused, plan = await _on_both_paths(postgres_url, new_prefix, scenario)
    assert [e[0] for e in stored['effects']] == ['call-0']
    assert [(e[0], e[3]) for e in stored['events']] == [(1, 'call-0')]
    assert [s[0] for s in stored['snapshots']] == [1]
    assert (stored['nodes'], stored['keys']) == (3, 1)
    assert [spy.steps for spy in fused] == [3, 1]
    # the fence's own statement failed on the server (it surfaces inside `write_step` or at the commit)
    assert {error for spy in fused for error in spy.raised} == {errors.CheckViolation}
    assert all(spy.step_operations == set() for spy in fused)
    assert [spy.steps for spy in plan] == [0, 0]
    assert all('check_lease' in spy.step_operations for spy in plan)


async def test_a_step_whose_history_is_gone_fails_as_on_the_plan_path_and_stores_nothing(
    postgres_url: str, new_prefix: Callable[[], str]
) -> None:
    """Another store deleted the run: the node the save hangs its new messages off is gone, the step
    fails with `StaleHistory`, storing nothing, and the engine writes the history whole once."""

    async def scenario(open_store: Callable[..., PostgresStepStore]) -> Stored:
        store, other = open_store(), open_store()
        await store.write_batch(_records('r', 0), snapshot=_save('r', 0, 'k0'))
        assert await other.delete_run('r')
        await store.write_batch(_records('r', 1), snapshot=_save('r', 1, 'k1'))
        return await _stored(store, postgres_url, 'r')

    stored, (fused, _), _ = await _on_both_paths(postgres_url, new_prefix, scenario)
    assert [(e[0], e[3]) for e in stored['events']] == [(1, 'call-1')]  # the refused step's are not there
    assert [e[0] for e in stored['effects']] == ['call-1']
    assert [(s[0], s[3]) for s in stored['snapshots']] == [(1, 5)]
    assert (stored['nodes'], stored['keys']) == (5, 1)  # the whole history, once
    assert fused.raised == [StaleHistory]
    assert fused.step_operations == set()


async def test_a_step_whose_snapshot_key_was_applied_stores_its_records_only(
    postgres_url: str, new_prefix: Callable[[], str]
) -> None:
    async def scenario(open_store: Callable[..., PostgresStepStore]) -> Stored:
        store = open_store()
        await store.write_batch(_records('r', 0), snapshot=_save('r', 0, 'k'))
        await store.write_batch(_records('r', 1), snapshot=_save('r', 1, 'k'))
        await store.write_batch(_records('r', 2), snapshot=_save('r', 2, 'k2'))  # continues the history
        return await _stored(store, postgres_url, 'r')

    stored, (fused,), _ = await _on_both_paths(postgres_url, new_prefix, scenario)
    assert [e[0] for e in stored['events']] == [1, 2, 3]
    assert [(s[0], s[3]) for s in stored['snapshots']] == [(1, 3), (2, 7)]
    assert (stored['nodes'], stored['keys']) == (7, 2)
    assert fused.steps == 3
    assert fused.step_operations == set()
