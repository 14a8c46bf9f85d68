"""The engine's helpers for network ports: pipelined reads and node ids reserved in blocks."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from stepcore import StepPersistence, ToolEffectStatus
from stepcore.common.features import SNAPSHOT_RETENTION
from stepcore.engine import Ask, EngineStore, NodeIdBlocks, PipelinedPort, ops
from stepcore.engine.memory import MemoryPort


class _PipelinedMemoryPort(PipelinedPort):
    """Rows in process memory behind a pipeline: every read has an ask, and each `pipeline` call
    (one round trip on a network) is recorded with how many requests it carried."""

    def __init__(self) -> None:
        self.rows = MemoryPort()
        self.trips: list[int] = []
        self.node_ids = NodeIdBlocks(block=4)
        self.reserved: list[int] = []
        self.handed: list[int] = []
        self._counter = 0

    async def pipeline(self, tx: Any, requests: Sequence[Any]) -> list[Any]:
        self.trips.append(len(requests))
        await asyncio.sleep(0)  # the round trip: other saves may run meanwhile
        return [self.rows.run(tx, op) for op in requests]

    def __getattr__(self, name: str) -> Any:
        # every read operation is an ask whose request is the operation itself
        method = name.removeprefix('ask_')
        if name.startswith('ask_') and method in _READS:
            return lambda op: Ask(op, lambda reply: reply)
        raise AttributeError(name)

    async def _reserve(self, count: int) -> range:
        await asyncio.sleep(0)
        self.reserved.append(count)
        first = self._counter + 1
        self._counter += count
        return range(first, self._counter + 1)

    async def put_snapshot(self, tx: Any, op: ops.PutSnapshot) -> list[int]:
        ids = await self.node_ids.take(len(op.bodies), self._reserve)
        self.handed += ids
        self.rows._next_node = ids[0] if ids else self.rows._next_node  # pyright: ignore[reportPrivateUsage]
        assert self.rows.put_snapshot(tx, op) == ids
        return ids

    async def insert_run(self, tx: Any, op: ops.InsertRun) -> ops.RunRow | None:
        return self.rows.insert_run(tx, op)

    async def delete_run(self, tx: Any, op: ops.DeleteRun) -> bool:
        return self.rows.delete_run(tx, op)

    async def put_events(self, tx: Any, op: ops.PutEvents) -> None:
        self.rows.put_events(tx, op)

    async def put_effects(self, tx: Any, op: ops.PutEffects) -> None:
        self.rows.put_effects(tx, op)

    async def delete_snapshots(self, tx: Any, op: ops.DeleteSnapshots) -> None:
        self.rows.delete_snapshots(tx, op)


_READS = frozenset(
    {
        'get_run',
        'list_runs',
        'list_run_ids',
        'list_events',
        'list_effects',
        'snapshot_key_applied',
        'node_exists',
        'snapshot_states',
        'list_snapshots',
        'get_nodes',
    }
)


class _PipelinedStore(EngineStore):
    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION})

    def __init__(self, *, max_snapshots_per_run: int | None = None) -> None:
        super().__init__(_PipelinedMemoryPort(), max_snapshots_per_run=max_snapshots_per_run)


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    calls = sum(1 for m in messages if isinstance(m, ModelResponse))
    if calls < 5:
        return ModelResponse(parts=[ToolCallPart('step', {'n': calls}, tool_call_id=f'call-{calls}')])
    return ModelResponse(parts=[TextPart('done')])


def _agent(store: EngineStore) -> Agent[None, str]:
    agent = Agent(FunctionModel(_model), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def step(n: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'step {n}'

    return agent


async def test_a_save_sends_its_checks_in_one_round_trip() -> None:
    store = _PipelinedStore(max_snapshots_per_run=3)
    port = store.port
    assert isinstance(port, _PipelinedMemoryPort)
    result = await _agent(store).run('go')
    (run,) = await store.list_runs()
    latest = await store.latest_snapshot(run.run_id)
    assert latest is not None
    assert latest.messages == result.all_messages()
    assert len(await store.list_snapshots(run.run_id)) == 3
    effects = await store.list_tool_effects(run.run_id)
    assert [e.status for e in effects] == [ToolEffectStatus.COMPLETED] * 5
    # a keyed save after the first asks three things at once (key applied, parent node, states)
    assert 3 in port.trips
    assert max(port.trips) == 3


async def test_node_ids_are_reserved_in_blocks_and_never_handed_out_twice() -> None:
    store = _PipelinedStore()
    port = store.port
    assert isinstance(port, _PipelinedMemoryPort)
    await asyncio.gather(*(_agent(store).run('go') for _ in range(6)))
    runs = await store.list_runs()
    assert len(runs) == 6
    for run in runs:
        latest = await store.latest_snapshot(run.run_id)
        assert latest is not None
        assert len(latest.messages) == 12
    # 6 runs of 12 messages took 72 ids, reserved 4 (or a save's shortfall plus 4) at a time
    assert sum(port.reserved) >= 72
    assert all(count >= 4 for count in port.reserved)
    assert len(port.reserved) < 72
    assert len(set(port.handed)) == len(port.handed) == 72


async def test_a_node_id_block_must_hold_an_id() -> None:
    with pytest.raises(ValueError, match='block=0 cannot reserve node ids: use 1 or more'):
        NodeIdBlocks(block=0)
