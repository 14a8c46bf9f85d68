"""How StepPersistence hands its writes to the store: batched when it can, one call per write when it cannot."""

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
    SnapshotSaved,
    StepEvent,
    StepPersistence,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.capability import DEFERRED_WRITE_DELAY
from stepcore.protocols import StepWrite
from stepcore.writes import apply_writes, check_writes
from stepcore_conformance.capability import function_model


class _Recording(InMemoryStepStore):
    """The in-memory store, noting each call the capability makes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[str]]] = []

    @staticmethod
    def _name(write: StepWrite) -> str:
        if isinstance(write, StepEvent):
            return write.kind.value
        return f'effect:{write.status.value}'

    async def append_event(self, event: StepEvent) -> None:
        self.calls.append(('append_event', [self._name(event)]))
        await super().append_event(event)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        self.calls.append(('record_tool_effect', [self._name(record)]))
        await super().record_tool_effect(record)

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        names = [self._name(w) for w in writes]
        self.calls.append(('write_batch', names + ([f'snapshot:{snapshot.state.value}'] if snapshot else [])))
        await InMemoryStepStore.write_batch(self, writes)
        if snapshot is not None:
            await InMemoryStepStore.save_snapshot(self, snapshot)

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        self.calls.append(('save_snapshot', [f'snapshot:{snapshot.state.value}']))
        await super().save_snapshot(snapshot)


class _Unbatched(_Recording):
    """A store without `write_batch`, as a third-party store may be."""

    write_batch = None  # type: ignore[assignment]


def _one_tool_then_done(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart('lookup', {'q': 'x'}, tool_call_id='c1')])
    return ModelResponse(parts=[TextPart('done')])


def _agent(store: InMemoryStepStore, *others: AbstractCapability[None]) -> Agent[None, str]:
    """One tool call, then an answer; `others` are attached after `StepPersistence`."""
    agent: Agent[None, str] = Agent(
        function_model(_one_tool_then_done), capabilities=[StepPersistence(store=store), *others]
    )

    @agent.tool_plain
    def lookup(q: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'found {q}'

    return agent


def _answering_agent(store: InMemoryStepStore) -> Agent[None, str]:
    """An agent whose model answers at once, with no tool call."""
    return Agent(
        function_model(lambda messages, info: ModelResponse(parts=[TextPart('answer')])),
        capabilities=[StepPersistence(store=store)],
    )


async def test_a_tool_call_is_one_batch_at_start_and_one_at_finish() -> None:
    store = _Recording()
    await _agent(store).run('go', run_id='batched')  # pyright: ignore[reportCallIssue]
    assert store.calls == [
        ('append_event', ['run_started']),
        ('append_event', ['model_request_started']),
        # the completed request travels with the tool call's ledger entry: one round trip
        ('write_batch', ['model_request_completed', 'effect:started', 'tool_call_started']),
        # the finished call and the snapshot that settles it travel with the next request's start
        ('write_batch', ['effect:completed', 'tool_call_completed', 'model_request_started', 'snapshot:complete']),
        ('write_batch', ['model_request_completed', 'snapshot:complete']),
        ('append_event', ['run_completed']),
    ]


async def test_the_tool_cycle_snapshot_holds_the_request_as_it_was_sent() -> None:
    """pydantic-ai stamps the tool-return request when it sends it; the snapshot stores it stamped, once."""
    store = _Recording()
    result = await _agent(store).run('go', run_id='stamped')  # pyright: ignore[reportCallIssue]
    boundary, final = await store.list_snapshots('stamped')
    sent = result.all_messages()
    assert boundary.messages == sent[: len(boundary.messages)]
    request = boundary.messages[-1]
    assert isinstance(request, ModelRequest)
    assert request.run_id == result.run_id
    # the final snapshot reuses it as stored: nothing of the boundary history was re-written
    assert final.messages[: len(boundary.messages)] == boundary.messages


async def test_a_tool_cycle_snapshot_is_written_on_its_own_when_the_next_request_is_slow_to_start() -> None:
    store = _Recording()
    seen_while_preparing: list[int] = []
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
            seen_while_preparing.append(len(await store.list_snapshots('slow-start')))
        return 'be brief'

    await agent.run('go', run_id='slow-start')  # pyright: ignore[reportCallIssue]
    assert seen_while_preparing == [1]
    assert ('write_batch', ['effect:completed', 'tool_call_completed', 'snapshot:complete']) in store.calls
    snapshots = await store.list_snapshots('slow-start')
    assert [(e.step_index, e.state) for e in announced] == [(s.step_index, s.state) for s in snapshots]


async def test_a_failure_before_the_next_request_writes_the_pending_snapshot_first() -> None:
    store = _Recording()
    with pytest.raises(UsageLimitExceeded):
        await _agent(store).run('go', run_id='limited', usage_limits=UsageLimits(request_limit=1))  # pyright: ignore[reportCallIssue]
    assert store.calls[3:] == [
        ('write_batch', ['effect:completed', 'tool_call_completed', 'snapshot:complete']),
        ('save_snapshot', ['snapshot:complete']),
        ('append_event', ['run_failed']),
    ]
    boundary, at_failure = await store.list_snapshots('limited')
    assert at_failure.messages == boundary.messages
    [effect] = await store.list_tool_effects('limited')
    assert effect.status is ToolEffectStatus.COMPLETED


async def test_a_store_without_write_batch_gets_one_call_per_write_and_the_same_records() -> None:
    batched, unbatched = _Recording(), _Unbatched()
    await _agent(batched).run('go', run_id='r')  # pyright: ignore[reportCallIssue]
    await _agent(unbatched).run('go', run_id='r')  # pyright: ignore[reportCallIssue]
    assert all(name != 'write_batch' for name, _ in unbatched.calls)
    assert [w for _, ws in unbatched.calls for w in ws] == [w for _, ws in batched.calls for w in ws]

    def trail(events: list[StepEvent]) -> list[tuple[EventKind, str | None, str | None]]:
        return [(e.kind, e.tool_call_id, e.idempotency_key) for e in events]

    assert trail(await unbatched.list_events('r')) == trail(await batched.list_events('r'))
    [effect] = await unbatched.list_tool_effects('r')
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
        ('write_batch', ['model_request_completed', 'snapshot:complete']),
        ('append_event', ['run_failed']),
    ]


async def test_apply_writes_refuses_other_records_before_writing() -> None:
    store = InMemoryStepStore()
    event = StepEvent(run_id='r', kind=EventKind.RUN_STARTED)
    bad: list[Any] = [event, 'snapshot?']
    with pytest.raises(TypeError, match='position 1'):
        await apply_writes(store, bad)
    assert await store.list_events('r') == []
    with pytest.raises(TypeError, match='write_batch got str'):
        check_writes(bad)


async def test_a_finished_call_is_written_on_its_own_while_a_sibling_still_runs() -> None:
    """A deferred write waits for the run's next write at most `DEFERRED_WRITE_DELAY` seconds of free loop."""
    store = _Recording()
    seen_while_waiting: list[ToolEffectStatus] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[ToolCallPart('fast', {}, tool_call_id='fast-1'), ToolCallPart('slow', {}, tool_call_id='slow-1')]
            )
        return ModelResponse(parts=[TextPart('done')])

    agent: Agent[None, str] = Agent(function_model(respond), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    async def fast() -> str:  # pyright: ignore[reportUnusedFunction]
        await asyncio.sleep(0)  # let the slow sibling start first
        return 'quick'

    @agent.tool_plain
    async def slow() -> str:  # pyright: ignore[reportUnusedFunction]
        await asyncio.sleep(DEFERRED_WRITE_DELAY * 10)
        effect = await store.get_tool_effect('siblings', 'fast-1')
        assert effect is not None
        seen_while_waiting.append(effect.status)
        return 'late'

    await agent.run('go', run_id='siblings')  # pyright: ignore[reportCallIssue]
    assert seen_while_waiting == [ToolEffectStatus.COMPLETED]
    # written on its own, by the timer, while the slow sibling was still running
    assert ('write_batch', ['effect:completed', 'tool_call_completed']) in store.calls


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

        async def append_event(self, event: StepEvent) -> None:
            if event.kind is EventKind.MODEL_REQUEST_COMPLETED and self.failures:
                self.failures -= 1
                raise OSError('disk hiccup')
            await super().append_event(event)

    store = Flaky()
    agent = _answering_agent(store)

    @agent.output_validator
    async def slow_check(output: str) -> str:  # pyright: ignore[reportUnusedFunction]
        await asyncio.sleep(DEFERRED_WRITE_DELAY * 10)
        return output

    store.write_batch = None  # type: ignore[assignment]  # one call per write, so the event fails alone
    await agent.run('go', run_id='flaky')  # pyright: ignore[reportCallIssue]
    assert 'could not write 1 record(s) of run' in caplog.text
    kinds = [e.kind for e in await store.list_events('flaky')]
    assert kinds == [
        EventKind.RUN_STARTED,
        EventKind.MODEL_REQUEST_STARTED,
        EventKind.MODEL_REQUEST_COMPLETED,
        EventKind.RUN_COMPLETED,
    ]
