"""How StepPersistence hands its writes to the store: in batches, deferred, and completions held for their snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability, Hooks
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.tools import RunContext
from pydantic_ai.usage import UsageLimits

from stepcore import (
    ContinuableSnapshot,
    EventKind,
    InMemoryStepStore,
    RunRecord,
    SnapshotSaved,
    StepEvent,
    StepPersistence,
    StepStore,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.capability import DEFERRED_WRITE_DELAY, run_writer
from stepcore.store.arguments import check_writes
from stepcore.store.contract import write_records
from stepcore.store.protocols import StepWrite
from stepcore_conformance.capability import function_model


@pytest.fixture
def no_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deferred writes wait for the run's next write however busy the machine is (the timer never fires first)."""
    monkeypatch.setattr(run_writer, 'DEFERRED_WRITE_DELAY', 60.0)


def _name(write: StepWrite | ContinuableSnapshot) -> str:
    if isinstance(write, StepEvent):
        return write.kind.value
    if isinstance(write, ContinuableSnapshot):
        return f'snapshot:{write.state.value}'
    return f'effect:{write.status.value}'


class _Recording(InMemoryStepStore):
    """The in-memory store, noting each write call the capability makes (a snapshot first, as the store writes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[str]]] = []

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        self.calls.append(('write_batch', ([_name(snapshot)] if snapshot else []) + [_name(w) for w in writes]))
        await super().write_batch(writes, snapshot=snapshot)


class _PerRecord(StepStore):
    """A store that leaves `write_batch` to the base class: one call per record, the snapshot first."""

    def __init__(self) -> None:
        self.inner = InMemoryStepStore()
        self.calls: list[str] = []

    async def register_run(self, record: RunRecord) -> None:
        await self.inner.register_run(record)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.inner.get_run(run_id)

    async def list_runs(
        self, *, conversation_id: str | None = None, parent_run_id: str | None = None
    ) -> list[RunRecord]:
        return await self.inner.list_runs(conversation_id=conversation_id, parent_run_id=parent_run_id)

    async def delete_run(self, run_id: str) -> bool:
        return await self.inner.delete_run(run_id)

    async def append_event(self, event: StepEvent) -> None:
        self.calls.append(_name(event))
        await self.inner.append_event(event)

    async def list_events(self, run_id: str) -> list[StepEvent]:
        return await self.inner.list_events(run_id)

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        self.calls.append(_name(snapshot))
        await self.inner.save_snapshot(snapshot)

    async def list_snapshots(self, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        return await self.inner.list_snapshots(run_id, include_interrupted=include_interrupted)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        self.calls.append(_name(record))
        await self.inner.record_tool_effect(record)

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return await self.inner.list_tool_effects(run_id)


def _one_tool_then_done(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart('lookup', {'q': 'x'}, tool_call_id='c1')])
    return ModelResponse(parts=[TextPart('done')])


def _agent(store: StepStore, *others: AbstractCapability[None]) -> Agent[None, str]:
    """One tool call, then an answer; `others` are attached after `StepPersistence`."""
    agent: Agent[None, str] = Agent(
        function_model(_one_tool_then_done),
        deps_type=type(None),
        capabilities=[StepPersistence[None](store=store), *others],
    )

    @agent.tool_plain
    def lookup(q: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'found {q}'

    return agent


def _answering_agent(store: StepStore) -> Agent[None, str]:
    """An agent whose model answers at once, with no tool call."""
    return Agent(
        function_model(lambda messages, info: ModelResponse(parts=[TextPart('answer')])),
        capabilities=[StepPersistence(store=store)],
    )


@pytest.mark.usefixtures('no_timer')
async def test_a_tool_call_is_one_batch_at_start_and_one_at_finish() -> None:
    store = _Recording()
    await _agent(store).run('go', run_id='batched')  # pyright: ignore[reportCallIssue]
    assert store.calls == [
        ('write_batch', ['run_started']),
        ('write_batch', ['model_request_started']),
        # the completed request travels with the tool call's ledger entry: one round trip
        ('write_batch', ['model_request_completed', 'effect:started', 'tool_call_started']),
        # the finished call goes with the snapshot that holds its result, and with the next request's start
        ('write_batch', ['snapshot:complete', 'effect:completed', 'tool_call_completed', 'model_request_started']),
        ('write_batch', ['snapshot:complete', 'model_request_completed']),
        ('write_batch', ['run_completed']),
    ]


async def test_the_tool_cycle_snapshot_holds_the_request_as_it_was_sent() -> None:
    """pydantic-ai stamps the tool-return request when it sends it; the snapshot stores it stamped, once."""
    store = _Recording()
    result = await _agent(store).run('go', run_id='stamped')  # pyright: ignore[reportCallIssue]
    boundary, final = await store.list_snapshots('stamped', include_interrupted=True)
    sent = result.all_messages()
    assert boundary.messages == sent[: len(boundary.messages)]
    request = boundary.messages[-1]
    assert isinstance(request, ModelRequest)
    assert request.run_id == result.run_id
    # the final snapshot reuses it as stored: nothing of the boundary history was re-written
    assert final.messages[: len(boundary.messages)] == boundary.messages


async def test_a_tool_cycle_snapshot_is_written_on_its_own_when_the_next_request_is_slow_to_start() -> None:
    store = _Recording()
    seen_while_preparing: list[tuple[int, ToolEffectStatus | None]] = []
    announced: list[SnapshotSaved] = []
    hooks = Hooks[Any]()

    @hooks.on.event(SnapshotSaved)
    async def collect(ctx: RunContext[Any], event: SnapshotSaved) -> None:  # pyright: ignore[reportUnusedFunction]
        announced.append(event)

    agent = _agent(store, hooks)

    @agent.instructions
    async def slow_instructions(ctx: RunContext[None]) -> str:  # pyright: ignore[reportUnusedFunction]
        if ctx.run_step > 1:
            await asyncio.sleep(DEFERRED_WRITE_DELAY * 10)
            effect = await store.get_tool_effect('slow-start', 'c1')
            seen_while_preparing.append(
                (len(await store.list_snapshots('slow-start', include_interrupted=True)), effect and effect.status)
            )
        return 'be brief'

    await agent.run('go', run_id='slow-start')  # pyright: ignore[reportCallIssue]
    # the snapshot went on its own, and the completed call with it
    assert seen_while_preparing == [(1, ToolEffectStatus.COMPLETED)]
    assert ('write_batch', ['snapshot:complete', 'effect:completed', 'tool_call_completed']) in store.calls
    snapshots = await store.list_snapshots('slow-start', include_interrupted=True)
    assert [(e.step_index, e.state) for e in announced] == [(s.step_index, s.state) for s in snapshots]


@pytest.mark.usefixtures('no_timer')
async def test_a_failure_before_the_next_request_writes_the_pending_snapshot_first() -> None:
    store = _Recording()
    with pytest.raises(UsageLimitExceeded):
        await _agent(store).run('go', run_id='limited', usage_limits=UsageLimits(request_limit=1))  # pyright: ignore[reportCallIssue]
    assert store.calls[3:] == [
        ('write_batch', ['snapshot:complete', 'effect:completed', 'tool_call_completed']),
        ('write_batch', ['snapshot:complete']),
        ('write_batch', ['run_failed']),
    ]
    boundary, at_failure = await store.list_snapshots('limited', include_interrupted=True)
    assert at_failure.messages == boundary.messages
    [effect] = await store.list_tool_effects('limited')
    assert effect.status is ToolEffectStatus.COMPLETED


@pytest.mark.usefixtures('no_timer')
async def test_a_store_without_its_own_write_batch_gets_one_call_per_record_and_the_same_records() -> None:
    batched, per_record = _Recording(), _PerRecord()
    await _agent(batched).run('go', run_id='r')  # pyright: ignore[reportCallIssue]
    await _agent(per_record).run('go', run_id='r')  # pyright: ignore[reportCallIssue]
    # the same records in the same order, the snapshot of each batch first
    assert per_record.calls == [name for _, names in batched.calls for name in names]
    assert per_record.calls.index('snapshot:complete') < per_record.calls.index('effect:completed')

    def trail(events: list[StepEvent]) -> list[tuple[EventKind, str | None, str | None]]:
        return [(e.kind, e.tool_call_id, e.idempotency_key) for e in events]

    assert trail(await per_record.list_events('r')) == trail(await batched.list_events('r'))
    [effect] = await per_record.list_tool_effects('r')
    assert effect.status is ToolEffectStatus.COMPLETED
    assert effect.args == {'q': 'x'}


async def test_events_are_stamped_in_the_order_they_happened() -> None:
    store = _Recording()
    await _agent(store).run('go', run_id='stamps')  # pyright: ignore[reportCallIssue]
    events = await store.list_events('stamps')
    assert [e.timestamp for e in events] == sorted(e.timestamp for e in events)
    [effect] = await store.list_tool_effects('stamps')
    started = next(e for e in events if e.kind is EventKind.TOOL_CALL_STARTED)
    assert effect.started_at <= started.timestamp <= effect.updated_at


@pytest.mark.usefixtures('no_timer')
async def test_a_failure_right_after_a_response_still_writes_the_deferred_completion() -> None:
    """The completed-request event waits for the run's next write; the failure path is one."""
    store = _Recording()
    agent = _answering_agent(store)

    @agent.output_validator
    def reject(output: str) -> str:  # pyright: ignore[reportUnusedFunction]
        raise RuntimeError('validator crashed')

    with pytest.raises(RuntimeError, match='validator crashed'):
        await agent.run('go', run_id='failing')  # pyright: ignore[reportCallIssue]
    kinds = [e.kind for e in await store.list_events('failing')]
    assert kinds == [
        EventKind.RUN_STARTED,
        EventKind.MODEL_REQUEST_STARTED,
        EventKind.MODEL_REQUEST_COMPLETED,
        EventKind.RUN_FAILED,
    ]
    # on_run_error saves the at-failure history (it holds a response): the deferred event goes with it
    assert store.calls[2:] == [
        ('write_batch', ['snapshot:complete', 'model_request_completed']),
        ('write_batch', ['run_failed']),
    ]


async def test_write_records_refuses_other_records_before_writing() -> None:
    store = InMemoryStepStore()
    event = StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0)
    bad: list[Any] = [event, 'snapshot?']
    with pytest.raises(TypeError, match='position 1'):
        await write_records(store, bad)
    assert await store.list_events('r') == []
    with pytest.raises(TypeError, match='write_batch got str'):
        check_writes(bad)


async def test_a_completed_request_is_written_while_a_slow_validator_runs() -> None:
    store = _Recording()
    trail_while_validating: list[list[EventKind]] = []
    agent = _answering_agent(store)

    @agent.output_validator
    async def slow_check(output: str) -> str:  # pyright: ignore[reportUnusedFunction]
        await asyncio.sleep(DEFERRED_WRITE_DELAY * 10)
        trail_while_validating.append([e.kind for e in await store.list_events('slow-validator')])
        return output

    await agent.run('go', run_id='slow-validator')  # pyright: ignore[reportCallIssue]
    assert trail_while_validating == [
        [EventKind.RUN_STARTED, EventKind.MODEL_REQUEST_STARTED, EventKind.MODEL_REQUEST_COMPLETED]
    ]


async def test_a_failed_background_write_is_retried_by_the_next_write(caplog: pytest.LogCaptureFixture) -> None:
    class Flaky(_Recording):
        failures = 1

        async def write_batch(
            self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None
        ) -> None:
            if snapshot is None and self.failures and any(_name(w) == 'model_request_completed' for w in writes):
                self.failures -= 1
                raise OSError('disk hiccup')
            await super().write_batch(writes, snapshot=snapshot)

    store = Flaky()
    agent = _answering_agent(store)

    @agent.output_validator
    async def slow_check(output: str) -> str:  # pyright: ignore[reportUnusedFunction]
        await asyncio.sleep(DEFERRED_WRITE_DELAY * 10)
        return output

    await agent.run('go', run_id='flaky')  # pyright: ignore[reportCallIssue]
    assert "could not write 1 record(s) of run 'flaky' yet (OSError: disk hiccup)" in caplog.text
    kinds = [e.kind for e in await store.list_events('flaky')]
    assert kinds == [
        EventKind.RUN_STARTED,
        EventKind.MODEL_REQUEST_STARTED,
        EventKind.MODEL_REQUEST_COMPLETED,
        EventKind.RUN_COMPLETED,
    ]
