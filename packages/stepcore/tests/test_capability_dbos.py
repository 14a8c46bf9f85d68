"""StepPersistence under DBOS durable execution: replayed runs write nothing twice.

DBOS is a process-wide singleton, so this module launches it once (SQLite system database in a
temporary directory) and destroys it, registry included, when the module's tests are done.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo

from stepcore import (
    ContinuableSnapshot,
    EventKind,
    InMemoryStepStore,
    RunRecord,
    SnapshotState,
    StepEvent,
    StepPersistence,
    ToolEffectRecord,
    ToolEffectStatus,
    annotate_tool_effect,
)
from stepcore.capability import OPERATION_NAMES
from stepcore_conformance.capability import function_model
from stepcore_conformance.support import ONE_TOOL_CALL_RUN_EVENTS


class RecordingStore(InMemoryStepStore):
    """The in-memory store, noting every write it receives (to show replay does not repeat them)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    async def register_run(self, record: RunRecord) -> None:
        self.writes.append('register_run')
        await super().register_run(record)

    async def append_event(self, event: StepEvent) -> None:
        self.writes.append(f'event:{event.kind.value}')
        await super().append_event(event)

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        self.writes.append(f'snapshot:{snapshot.state.value}')
        await super().save_snapshot(snapshot)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        self.writes.append(f'effect:{record.status.value}')
        await super().record_tool_effect(record)


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if sum(isinstance(m, ModelRequest) for m in messages) == 1:
        return ModelResponse(parts=[ToolCallPart(tool_name='work', args={}, tool_call_id='c1')])
    return ModelResponse(parts=[TextPart('done')])


store = RecordingStore()
tool_calls: list[str] = []
cancel_in_tool: set[str] = set()

agent = Agent(
    function_model(respond),
    name='durable_agent',
    capabilities=[StepPersistence(store=store), DBOSDurability()],
)


@agent.tool
async def work(ctx: RunContext[Any]) -> str:
    tool_calls.append('work')
    await annotate_tool_effect(store, ctx, idempotency_key='work-once', effect_summary='did the work')
    workflow_id = DBOS.workflow_id
    if workflow_id in cancel_in_tool:
        # Interrupt the workflow mid tool call: its next durable step refuses to run.
        cancel_in_tool.discard(workflow_id)
        await DBOS.cancel_workflow_async(workflow_id)
    return 'worked'


@DBOS.workflow(name='stepcore_test_run_agent')
async def run_agent(prompt: str) -> str:
    return (await agent.run(prompt)).output


@pytest.fixture(scope='module', autouse=True)
def dbos_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    database = Path(tmp_path_factory.mktemp('dbos')) / 'dbos.sqlite'
    DBOS(config={'name': 'stepcoretests', 'system_database_url': f'sqlite:///{database}'})
    DBOS.launch()
    try:
        yield
    finally:
        DBOS.destroy(destroy_registry=True)


@pytest.fixture(autouse=True)
def fresh_state() -> None:
    store.writes.clear()
    tool_calls.clear()
    cancel_in_tool.clear()


async def _the_run(workflow_id: str) -> RunRecord:
    runs = [r for r in await store.list_runs() if r.run_id.startswith(f'{workflow_id}:')]
    assert len(runs) == 1, runs
    return runs[0]


async def test_operations_are_bound_under_stable_names() -> None:
    found: list[AbstractCapability[Any]] = []
    agent.root_capability.apply(found.append)
    [persistence] = [c for c in found if isinstance(c, StepPersistence)]
    [durability] = [c for c in found if isinstance(c, DBOSDurability)]
    assert persistence.id == 'step_persistence'
    bound = durability._bound_capability_operations  # pyright: ignore[reportPrivateUsage]
    assert sorted(name for (owner, name) in bound if owner == 'step_persistence') == sorted(OPERATION_NAMES)


async def test_completed_workflow_called_again_writes_nothing() -> None:
    with SetWorkflowID('wf-twice'):
        assert await run_agent('go') == 'done'
    first_writes = list(store.writes)
    record = await _the_run('wf-twice')
    events = await store.list_events(record.run_id)
    snapshots = await store.list_snapshots(record.run_id, include_interrupted=True)

    store.writes.clear()
    with SetWorkflowID('wf-twice'):
        assert await run_agent('go') == 'done'
    assert store.writes == []
    assert tool_calls == ['work']
    assert await store.list_events(record.run_id) == events
    assert len(await store.list_snapshots(record.run_id, include_interrupted=True)) == len(snapshots) == 2
    assert first_writes.count('register_run') == 1
    assert record.run_id == 'wf-twice:1'  # ctx.run_id under DBOS is derived from the workflow id


async def test_interrupted_workflow_recovers_without_duplicates() -> None:
    cancel_in_tool.add('wf-resume')
    with SetWorkflowID('wf-resume'), pytest.raises(BaseException, match='cancelled'):
        await run_agent('go')
    record = await _the_run('wf-resume')
    before = await store.list_events(record.run_id)
    assert [e.kind for e in before] == [
        EventKind.RUN_STARTED,
        EventKind.MODEL_REQUEST_STARTED,
        EventKind.MODEL_REQUEST_COMPLETED,
        EventKind.TOOL_CALL_STARTED,
    ]
    [started] = await store.list_unresolved_tool_effects(record.run_id)
    assert started.status is ToolEffectStatus.STARTED
    assert started.idempotency_key == 'work-once'

    store.writes.clear()
    handle = await DBOS.resume_workflow_async('wf-resume')
    assert await handle.get_result() == 'done'

    # The replay re-ran the workflow code (the tool is plain workflow code, so it ran again), but
    # every store write that was journaled came back from the journal instead of being repeated.
    assert tool_calls == ['work', 'work']
    assert 'register_run' not in store.writes
    assert 'event:run_started' not in store.writes
    assert store.writes.count('event:tool_call_started') == 0
    after = await store.list_events(record.run_id)
    assert after[: len(before)] == before
    assert [e.kind for e in after] == list(ONE_TOOL_CALL_RUN_EVENTS)
    assert len({e.idempotency_key for e in after}) == len(after)
    snapshots = await store.list_snapshots(record.run_id, include_interrupted=True)
    assert [s.state for s in snapshots] == [SnapshotState.COMPLETE, SnapshotState.COMPLETE]
    [effect] = await store.list_tool_effects(record.run_id)
    assert effect.status is ToolEffectStatus.COMPLETED
    assert (effect.idempotency_key, effect.effect_summary) == ('work-once', 'did the work')
    # The start time is the journaled one from the interrupted execution.
    assert effect.started_at == started.started_at
    assert (await store.get_run(record.run_id)) == record


async def test_the_journal_saves_a_cycle_snapshot_before_the_calls_it_settles() -> None:
    """One durable operation per write: the snapshot holding a call's result is journaled before its completion."""
    with SetWorkflowID('wf-order'):
        assert await run_agent('go') == 'done'
    steps = await DBOS.list_workflow_steps_async('wf-order', load_output=False)
    prefix = 'durable_agent__capability__step_persistence.'
    operations = [s['function_name'].removeprefix(prefix) for s in steps if s['function_name'].startswith(prefix)]
    assert operations == [
        'registration_identity',
        'register_run',
        'append_event',  # run_started
        'append_event',  # model_request_started
        'append_event',  # model_request_completed
        'tool_effect_started',
        'append_event',  # tool_call_started
        'tool_effect_started',  # the tool's annotation
        'save_snapshot',  # the cycle's snapshot, holding the tool's return
        'tool_effect_finished',  # completed, only now
        'append_event',  # tool_call_completed
        'append_event',  # model_request_started
        'append_event',  # model_request_completed
        'save_snapshot',
        'append_event',  # run_completed
    ]
    assert store.writes[store.writes.index('snapshot:complete') :][:3] == [
        'snapshot:complete',
        'effect:completed',
        'event:tool_call_completed',
    ]
