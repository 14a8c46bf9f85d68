"""The agent section: real pydantic-ai `Agent` runs recorded through a backend's store.

A short smoke check that `StepPersistence` works on top of the store: a tool run is recorded and
continues, a failing tool is recorded as such (also when a policy capability around it converts the
tool's exception or recovers with a substitute result: the store names the tool's own exception),
`SnapshotSaved` is delivered, and (for a `persistent` store) a process killed in the middle of a
tool call leaves what recovery needs.
The capability's own scenarios are tested once, in stepcore's test suite. Models are pydantic-ai
`FunctionModel`s: no network.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability, Hooks
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.tools import ToolDefinition

from stepcore import (
    EventKind,
    SnapshotSaved,
    SnapshotState,
    StepPersistence,
    StepStore,
    ToolEffectStatus,
    annotate_tool_effect,
    continue_run,
    inspect_recovery,
    is_provider_valid,
)
from stepcore.backend import PERSISTENT, encode_message

from ._support import StoreFixtures, needs_feature, new_id
from .support import ONE_TOOL_CALL_RUN_EVENTS, kill_when_ready

__all__ = (
    'CapabilityConformance',
    'RedactingPolicy',
    'SubstitutingPolicy',
    'count_requests',
    'encoded',
    'event_kinds',
    'function_model',
    'kill_child_main',
    'script',
    'tool_call',
)

Responder = Callable[[list[ModelMessage], AgentInfo], ModelResponse]


def function_model(respond: Responder) -> FunctionModel:
    """A `FunctionModel` answering both plain and streamed requests with `respond`'s response."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        response = respond(messages, info)
        calls: DeltaToolCalls = {}
        for index, part in enumerate(response.parts):
            if isinstance(part, TextPart):
                yield part.content
            elif isinstance(part, ToolCallPart):
                calls[index] = DeltaToolCall(
                    name=part.tool_name, json_args=json.dumps(part.args_as_dict()), tool_call_id=part.tool_call_id
                )
        if calls:
            yield calls

    return FunctionModel(respond, stream_function=stream)


def count_requests(messages: Sequence[ModelMessage]) -> int:
    """How many requests a history holds."""
    return sum(isinstance(m, ModelRequest) for m in messages)


def tool_call(name: str, call_id: str, **args: Any) -> ToolCallPart:
    """A tool call part."""
    return ToolCallPart(tool_name=name, args=args, tool_call_id=call_id)


def script(*responses: ModelResponse | Exception) -> Responder:
    """Answer the n-th model request of a run (counted by requests in the history) with the n-th item."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        item = responses[min(count_requests(messages), len(responses)) - 1]
        if isinstance(item, Exception):
            raise item
        return item

    return respond


def encoded(messages: Sequence[ModelMessage]) -> list[bytes]:
    """Each message as stepcore encodes it, to compare content."""
    return [encode_message(m) for m in messages]


def event_kinds(events: Sequence[Any]) -> list[EventKind]:
    """The kinds of a list of events."""
    return [e.kind for e in events]


def _returns(message: ModelMessage) -> list[str]:
    return [p.tool_call_id for p in message.parts if isinstance(p, ToolReturnPart)]


@dataclass
class RedactingPolicy(AbstractCapability[Any]):
    """A tool-failure policy as applications write them: the model is told `message` in a `ToolFailed`,
    never the tool's own exception."""

    message: str = 'the tool failed; details withheld'

    async def on_tool_execute_error(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        error: Exception,
    ) -> Any:
        raise ToolFailed(self.message) from error


@dataclass
class SubstitutingPolicy(AbstractCapability[Any]):
    """A fallback capability: a tool that raises answers `result` instead."""

    result: str = 'a cached answer'

    async def on_tool_execute_error(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        error: Exception,
    ) -> Any:
        return self.result


def _failing_tool_agent(store: StepStore, run_id: str, policy: AbstractCapability[Any]) -> Agent[None, str]:
    """An agent whose tool `ship` raises `RuntimeError('disk full')`, with `policy` listed before (outside)
    `StepPersistence`."""
    agent = Agent(
        function_model(script(ModelResponse(parts=[tool_call('ship', 'c1')]), ModelResponse(parts=[TextPart('done')]))),
        capabilities=[policy, StepPersistence(store=store, run_id=run_id)],
    )

    @agent.tool_plain
    def ship() -> str:  # pyright: ignore[reportUnusedFunction]
        raise RuntimeError('disk full')

    return agent


class CapabilityConformance(StoreFixtures):
    """Real `Agent` runs with `StepPersistence` recorded into the subclass's `store` fixture."""

    async def test_tool_run_is_recorded_and_continues(self, store: StepStore) -> None:
        agent = Agent(
            function_model(
                script(ModelResponse(parts=[tool_call('add', 'c1', a=1, b=2)]), ModelResponse(parts=[TextPart('3')]))
            ),
            name='adder',
            capabilities=[StepPersistence(store=store)],
        )

        @agent.tool_plain
        def add(a: int, b: int) -> int:  # pyright: ignore[reportUnusedFunction]
            return a + b

        conversation_id = new_id('conv')
        result = await agent.run('add 1 and 2', conversation_id=conversation_id)
        run_id = result.run_id
        record = await store.get_run(run_id=run_id)
        assert record is not None
        assert (record.agent_name, record.conversation_id) == ('adder', conversation_id)
        assert event_kinds(await store.list_events(run_id=run_id)) == list(ONE_TOOL_CALL_RUN_EVENTS)
        effects = await store.list_tool_effects(run_id=run_id)
        assert [(e.tool_name, e.tool_call_id, e.status, e.args) for e in effects] == [
            ('add', 'c1', ToolEffectStatus.COMPLETED, {'a': 1, 'b': 2})
        ]
        assert await store.list_unresolved_tool_effects(run_id=run_id) == []
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.state is SnapshotState.COMPLETE
        assert encoded(latest.messages) == encoded(result.all_messages())

        # The stored history continues the conversation: the next run's model sees the tool result.
        def recall(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            earlier = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
            return ModelResponse(parts=[TextPart(f'earlier results: {earlier}')])

        follow_up = Agent(function_model(recall), capabilities=[StepPersistence(store=store)])
        history = await continue_run(store, run_id=run_id)
        assert is_provider_valid(history)
        resumed = await follow_up.run('what did you get?', message_history=history, conversation_id=conversation_id)
        assert resumed.output == 'earlier results: [3]'
        assert [r.run_id for r in await store.list_runs(conversation_id=conversation_id)] == [run_id, resumed.run_id]

    async def test_failing_tool_leaves_a_failed_entry_and_an_interrupted_snapshot(self, store: StepStore) -> None:
        run_id = new_id('run')
        agent = Agent(
            function_model(
                script(
                    ModelResponse(parts=[tool_call('ok', 'c1')]),
                    ModelResponse(parts=[tool_call('ok', 'c2'), tool_call('boom', 'c3')]),
                    ModelResponse(parts=[TextPart('never')]),
                )
            ),
            capabilities=[StepPersistence(store=store, run_id=run_id)],
        )

        @agent.tool_plain
        def ok() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'fine'

        @agent.tool_plain
        def boom() -> str:  # pyright: ignore[reportUnusedFunction]
            raise RuntimeError('disk on fire')

        with pytest.raises(RuntimeError, match='disk on fire'):
            await agent.run('go')

        effects = {e.tool_call_id: e for e in await store.list_tool_effects(run_id=run_id)}
        assert effects['c1'].status is ToolEffectStatus.COMPLETED
        assert effects['c3'].status is ToolEffectStatus.FAILED
        assert 'disk on fire' in (effects['c3'].error or '')
        # c2 returned, but its result is in no complete snapshot (its sibling raised): the crash
        # rule keeps it `started`, to be checked, rather than `completed` with the result lost.
        assert [e.tool_call_id for e in await store.list_unresolved_tool_effects(run_id=run_id)] == ['c2']
        assert event_kinds(await store.list_events(run_id=run_id))[-1] is EventKind.RUN_FAILED
        newest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
        assert newest is not None
        assert newest.state is SnapshotState.INTERRUPTED
        assert not is_provider_valid(newest.messages)
        # The default read path stops at the last settled cycle: the first call's result.
        settled = await continue_run(store, run_id=run_id)
        assert is_provider_valid(settled)
        assert _returns(settled[-1]) == ['c1']
        report = await inspect_recovery(store=store, run_id=run_id)
        assert report.failed_tools == ('boom',)
        assert report.interrupted

    async def test_a_policy_converting_the_error_leaves_the_tools_own_exception(self, store: StepStore) -> None:
        run_id = new_id('run')
        policy = RedactingPolicy()
        result = await _failing_tool_agent(store, run_id, policy).run('ship it')
        assert result.output == 'done'
        (entry,) = await store.list_tool_effects(run_id=run_id)
        assert (entry.status, entry.error) == (ToolEffectStatus.FAILED, "RuntimeError('disk full')")
        events = await store.list_events(run_id=run_id)
        failed = [e for e in events if e.kind is EventKind.TOOL_CALL_FAILED]
        assert [(e.tool_call_id, e.error) for e in failed] == [('c1', "RuntimeError('disk full')")]
        # What the policy made of it is the model's business, not the ledger's.
        assert all(policy.message not in (e.error or '') for e in events)
        assert policy.message not in (entry.effect_summary or '')

    async def test_a_policy_recovering_with_a_substitute_completes_and_keeps_the_failure(
        self, store: StepStore
    ) -> None:
        run_id = new_id('run')
        result = await _failing_tool_agent(store, run_id, SubstitutingPolicy()).run('ship it')
        assert result.output == 'done'
        (entry,) = await store.list_tool_effects(run_id=run_id)
        assert entry.status is ToolEffectStatus.COMPLETED
        assert entry.error == "RuntimeError('disk full')"
        assert await store.list_unresolved_tool_effects(run_id=run_id) == []
        tool_events = [(e.kind, e.error) for e in await store.list_events(run_id=run_id) if e.tool_call_id == 'c1']
        assert tool_events == [
            (EventKind.TOOL_CALL_STARTED, None),
            (EventKind.TOOL_CALL_FAILED, "RuntimeError('disk full')"),
            (EventKind.TOOL_CALL_COMPLETED, None),
        ]
        # The completion rests on a complete snapshot holding the substitute, as any completion does.
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        returns = [p for m in latest.messages for p in m.parts if isinstance(p, ToolReturnPart)]
        assert [(p.tool_call_id, p.content) for p in returns] == [('c1', 'a cached answer')]

    async def test_snapshot_saved_is_delivered_for_every_snapshot(self, store: StepStore) -> None:
        run_id = new_id('run')
        seen: list[SnapshotSaved] = []
        hooks = Hooks[Any]()

        @hooks.on.event(SnapshotSaved)
        async def collect(ctx: RunContext[Any], event: SnapshotSaved) -> None:  # pyright: ignore[reportUnusedFunction]
            seen.append(event)

        agent = Agent(
            function_model(
                script(ModelResponse(parts=[tool_call('ok', 'c1')]), ModelResponse(parts=[TextPart('done')]))
            ),
            capabilities=[StepPersistence(store=store, run_id=run_id), hooks],
        )

        @agent.tool_plain
        def ok() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'fine'

        await agent.run('go')
        snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        assert snapshots
        assert [(e.persistence_run_id, e.step_index, e.state) for e in seen] == [
            (run_id, s.step_index, s.state) for s in snapshots
        ]

    # --- crash safety: a real process killed mid tool call -------------------------------------

    @needs_feature(PERSISTENT)
    async def test_killed_process_leaves_unresolved_effect_and_settled_snapshot(
        self, store: StepStore, store_spec: dict[str, Any] | None, tmp_path: Path
    ) -> None:
        assert store_spec is not None  # the feature gate fails a persistent store without one
        run_id = new_id('killed')
        await store.aclose()
        ready = tmp_path / 'tool-started'
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            '-c',
            'from stepcore_conformance.capability import kill_child_main; kill_child_main()',
            json.dumps({'spec': store_spec, 'ready': str(ready), 'run_id': run_id}),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        await kill_when_ready(child, ready, polls=2400, failure='the child process never reached the tool call')

        from stepcore import from_spec

        fresh = from_spec(**store_spec)
        try:
            unresolved = await fresh.list_unresolved_tool_effects(run_id)
            assert [(e.tool_name, e.tool_call_id, e.status) for e in unresolved] == [
                ('slow_write', 'write-1', ToolEffectStatus.STARTED)
            ]
            assert unresolved[0].idempotency_key == 'write-1-key'
            settled = await continue_run(fresh, run_id=run_id)
            assert is_provider_valid(settled)
            assert [p.tool_call_id for p in settled[-1].parts if isinstance(p, ToolReturnPart)] == ['read-1']
            interrupted = await continue_run(fresh, run_id=run_id, include_interrupted=True)
            assert isinstance(interrupted[-1], ModelResponse)
            proposed = [p for p in interrupted[-1].parts if isinstance(p, ToolCallPart)]
            assert [(c.tool_name, c.tool_call_id, c.args_as_dict()) for c in proposed] == [
                ('slow_write', 'write-1', {'path': 'out.txt'})
            ]
            kinds = event_kinds(await fresh.list_events(run_id))
            assert kinds[-1] is EventKind.TOOL_CALL_STARTED
            assert EventKind.RUN_FAILED not in kinds
            report = await inspect_recovery(store=fresh, run_id=run_id)
            assert report.interrupted
            assert report.completed_tools == ('read',)
        finally:
            await fresh.aclose()


def kill_child_main() -> None:
    """Child process of the crash test: run an agent whose second tool blocks until the process is killed."""
    config = json.loads(sys.argv[-1])

    async def main() -> None:
        from stepcore import from_spec

        store = from_spec(**config['spec'])
        ready = Path(config['ready'])
        agent = Agent(
            function_model(
                script(
                    ModelResponse(parts=[tool_call('read', 'read-1')]),
                    ModelResponse(parts=[tool_call('slow_write', 'write-1', path='out.txt')]),
                    ModelResponse(parts=[TextPart('never reached')]),
                )
            ),
            capabilities=[StepPersistence(store=store, run_id=config['run_id'], capture_frontier=True)],
        )

        @agent.tool_plain
        def read() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'contents'

        @agent.tool
        async def slow_write(ctx: RunContext[Any], path: str) -> str:  # pyright: ignore[reportUnusedFunction]
            await annotate_tool_effect(store, ctx, idempotency_key='write-1-key', effect_summary=f'write {path}')
            ready.write_text('started')
            await asyncio.sleep(3600)
            return 'written'

        await agent.run('read then write')

    asyncio.run(main())
