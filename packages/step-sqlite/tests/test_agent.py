"""A real agent run persisted to a SQLite file and read back by a fresh store."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_sqlite import SqliteStepStore
from stepcore import ContinuableSnapshot, EventKind, SnapshotState, ToolEffectStatus
from stepcore.capability import StepPersistence


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    calls = sum(1 for m in messages if isinstance(m, ModelResponse))
    if calls < 3:
        return ModelResponse(parts=[ToolCallPart('double', {'n': calls + 1}, tool_call_id=f'call-{calls}')])
    return ModelResponse(parts=[TextPart('all doubled')])


async def test_a_run_persisted_through_from_spec_reads_back_from_the_file(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    persistence = StepPersistence.from_spec(backend='sqlite', database=str(db), agent_name='doubler')
    assert isinstance(persistence.store, SqliteStepStore)
    agent = Agent(FunctionModel(_model), capabilities=[persistence])

    @agent.tool_plain
    def double(n: int) -> str:
        return 'x' * 3000 + str(2 * n)

    result = await agent.run('double 1, 2 and 3')
    await persistence.store.aclose()

    store = SqliteStepStore(database=db)
    try:
        (run,) = await store.list_runs()
        assert run.agent_name == 'doubler'
        latest = await store.latest_snapshot(run.run_id)
        assert latest is not None
        assert latest.state is SnapshotState.COMPLETE
        assert latest.messages == result.all_messages()
        snapshots = await store.list_snapshots(run.run_id, include_interrupted=True)
        assert len(snapshots) >= 4
        assert [len(s.messages) for s in snapshots] == sorted(len(s.messages) for s in snapshots)
        effects = await store.list_tool_effects(run.run_id)
        assert [e.tool_call_id for e in effects] == ['call-0', 'call-1', 'call-2']
        assert all(e.status is ToolEffectStatus.COMPLETED for e in effects)
        kinds = [e.kind for e in await store.list_events(run.run_id)]
        assert kinds[0] is EventKind.RUN_STARTED
        assert kinds[-1] is EventKind.RUN_COMPLETED
        assert kinds.count(EventKind.TOOL_CALL_COMPLETED) == 3
        # the continued conversation is accepted by pydantic-ai as message_history
        follow_up = await Agent(FunctionModel(_model)).run('and again?', message_history=latest.messages)
        assert follow_up.output == 'all doubled'
    finally:
        await store.aclose()


class _TrimmingStore(SqliteStepStore):
    """A subclass that keeps only the last two messages of every snapshot it saves."""

    saved: int = 0

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        self.saved += 1
        await super().save_snapshot(dataclasses.replace(snapshot, messages=snapshot.messages[-2:]))


async def test_a_subclass_overriding_save_snapshot_sees_and_shapes_every_snapshot(tmp_path: Path) -> None:
    store = _TrimmingStore(database=tmp_path / 'runs.db')
    agent = Agent(FunctionModel(_model), capabilities=[StepPersistence(store=store, agent_name='doubler')])

    @agent.tool_plain
    def double(n: int) -> str:
        return str(2 * n)

    try:
        await agent.run('double 1, 2 and 3')
        (run,) = await store.list_runs()
        stored = await store.list_snapshots(run.run_id, include_interrupted=True)
        assert store.saved == len(stored) >= 4
        assert all(len(s.messages) <= 2 for s in stored)
    finally:
        await store.aclose()
