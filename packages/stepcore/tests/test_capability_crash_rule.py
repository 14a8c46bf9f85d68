"""The crash rule, capability side: a call is `completed` only with, or after, a complete snapshot of its result."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo

from stepcore import (
    ContinuableSnapshot,
    EventKind,
    InMemoryStepStore,
    SnapshotState,
    StepPersistence,
    ToolEffectStatus,
    inspect_recovery,
)
from stepcore.capability import DEFERRED_WRITE_DELAY
from stepcore.store.protocols import StepWrite
from stepcore_conformance.capability import function_model


def _fast_and_slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(
            parts=[ToolCallPart('fast', {}, tool_call_id='fast-1'), ToolCallPart('slow', {}, tool_call_id='slow-1')]
        )
    return ModelResponse(parts=[TextPart('done')])


def _returns(snapshot: ContinuableSnapshot) -> list[str]:
    return sorted(
        part.tool_call_id
        for message in snapshot.messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    )


def _agent(store: InMemoryStepStore, run_id: str, *, slow_fails: bool = False) -> tuple[Agent[None, str], list[str]]:
    """`fast` returns at once; `slow` waits until `fast` is done and the deferred-write timer had time to fire."""
    agent: Agent[None, str] = Agent(
        function_model(_fast_and_slow), capabilities=[StepPersistence(store=store, run_id=run_id)]
    )
    fast_returned = asyncio.Event()
    seen_while_slow_runs: list[str] = []

    @agent.tool_plain
    async def fast() -> str:  # pyright: ignore[reportUnusedFunction]
        fast_returned.set()
        return 'quick'

    @agent.tool_plain
    async def slow() -> str:  # pyright: ignore[reportUnusedFunction]
        await fast_returned.wait()
        await asyncio.sleep(DEFERRED_WRITE_DELAY * 10)
        effect = await store.get_tool_effect(run_id, 'fast-1')
        assert effect is not None
        seen_while_slow_runs.append(effect.status.value)
        seen_while_slow_runs.extend(e.kind.value for e in await store.list_events(run_id) if e.tool_call_id == 'fast-1')
        if slow_fails:
            raise RuntimeError('slow broke')
        return 'late'

    return agent, seen_while_slow_runs


async def test_a_fast_call_stays_started_until_the_cycle_snapshot_holds_both_results() -> None:
    store = InMemoryStepStore()
    agent, seen_while_slow_runs = _agent(store, 'siblings')
    await agent.run('go')
    # the timer wrote nothing of the finished call while its sibling ran
    assert seen_while_slow_runs == ['started', 'tool_call_started']
    effects = {e.tool_call_id: e.status for e in await store.list_tool_effects('siblings')}
    assert effects == {'fast-1': ToolEffectStatus.COMPLETED, 'slow-1': ToolEffectStatus.COMPLETED}
    boundary = (await store.list_snapshots('siblings', include_interrupted=True))[0]
    assert boundary.state is SnapshotState.COMPLETE
    assert _returns(boundary) == ['fast-1', 'slow-1']


async def test_a_run_whose_second_call_raises_leaves_the_first_started() -> None:
    store = InMemoryStepStore()
    agent, seen_while_slow_runs = _agent(store, 'broken-sibling', slow_fails=True)
    with pytest.raises(RuntimeError, match='slow broke'):
        await agent.run('go')
    assert seen_while_slow_runs == ['started', 'tool_call_started']
    report = await inspect_recovery(store=store, run_id='broken-sibling')
    # `fast` returned, but its result is in no complete snapshot: resuming may run it again, so it is unknown
    assert [e.tool_call_id for e in report.unresolved_effects] == ['fast-1']
    assert report.completed_tools == ()
    assert report.failed_tools == ('slow',)
    assert report.settled_snapshot is None
    assert report.newest_snapshot is not None
    assert report.newest_snapshot.state is SnapshotState.INTERRUPTED
    kinds = [e.kind for e in await store.list_events('broken-sibling') if e.tool_call_id == 'fast-1']
    assert kinds == [EventKind.TOOL_CALL_STARTED]


async def test_a_completion_whose_snapshot_write_failed_goes_with_the_failure_snapshot() -> None:
    """The batch carrying the cycle's snapshot fails; the completion is not lost to it, nor written alone."""

    class FailsOnce(InMemoryStepStore):
        def __init__(self) -> None:
            super().__init__()
            self.failed = False

        async def write_batch(
            self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None
        ) -> None:
            if snapshot is not None and not self.failed:
                self.failed = True
                raise OSError('disk full')
            await super().write_batch(writes, snapshot=snapshot)

    def one_call(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart('lookup', {}, tool_call_id='c1')])
        return ModelResponse(parts=[TextPart('done')])

    store = FailsOnce()
    agent: Agent[None, str] = Agent(function_model(one_call), capabilities=[StepPersistence(store=store, run_id='f')])

    @agent.tool_plain
    def lookup() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'found'

    with pytest.raises(OSError, match='disk full'):
        await agent.run('go')
    report = await inspect_recovery(store=store, run_id='f')
    assert report.completed_tools == ('lookup',)
    assert report.unresolved_effects == []
    assert report.settled_snapshot is not None
    assert _returns(report.settled_snapshot) == ['c1']
    assert [e.kind for e in await store.list_events('f')][-1] is EventKind.RUN_FAILED


async def test_the_timer_writes_a_failed_sibling_but_holds_a_completed_one() -> None:
    def three_calls(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart('fast', {}, tool_call_id='fast-1'),
                    ToolCallPart('retry', {}, tool_call_id='retry-1'),
                    ToolCallPart('slow', {}, tool_call_id='slow-1'),
                ]
            )
        return ModelResponse(parts=[TextPart('done')])

    store = InMemoryStepStore()
    agent: Agent[None, str] = Agent(
        function_model(three_calls), capabilities=[StepPersistence(store=store, run_id='three')]
    )
    finished = asyncio.Event()
    seen_while_slow_runs: dict[str, ToolEffectStatus] = {}

    @agent.tool_plain
    async def fast() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'quick'

    @agent.tool_plain
    async def retry() -> str:  # pyright: ignore[reportUnusedFunction]
        finished.set()
        raise ModelRetry('ask again')

    @agent.tool_plain
    async def slow() -> str:  # pyright: ignore[reportUnusedFunction]
        await finished.wait()
        await asyncio.sleep(DEFERRED_WRITE_DELAY * 10)
        seen_while_slow_runs.update({e.tool_call_id: e.status for e in await store.list_tool_effects('three')})
        return 'late'

    await agent.run('go')
    assert seen_while_slow_runs == {
        'fast-1': ToolEffectStatus.STARTED,
        'retry-1': ToolEffectStatus.FAILED,
        'slow-1': ToolEffectStatus.STARTED,
    }
    effects = {e.tool_call_id: e.status for e in await store.list_tool_effects('three')}
    assert effects == {
        'fast-1': ToolEffectStatus.COMPLETED,
        'retry-1': ToolEffectStatus.FAILED,
        'slow-1': ToolEffectStatus.COMPLETED,
    }
