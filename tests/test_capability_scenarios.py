"""`StepPersistence` scenarios: real pydantic-ai `Agent` runs recorded through a store.

These check the capability itself (what it records for each way a run can go, and what reading it
back gives), so they run here, against the in-memory store and a SQLite file, rather than in every
backend's conformance run; the kit keeps a short agent section per store. Models are pydantic-ai
`FunctionModel`s: no network. The checks are on what is stored once a run ends, not on when each
write happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability, Hooks, ProcessHistory
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
    repair_messages,
)
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.run import AgentRunResult

from step_sqlite import SqliteStepStore
from stepcore import (
    EventKind,
    InMemoryStepStore,
    SnapshotSaved,
    SnapshotState,
    StepPersistence,
    StepStore,
    ToolEffectStatus,
    annotate_tool_effect,
    continue_run,
    fork_run,
    inspect_recovery,
    is_provider_valid,
)
from stepcore_conformance.capability import count_requests, encoded, event_kinds, function_model, script, tool_call
from stepcore_conformance.support import ONE_TOOL_CALL_RUN_EVENTS

Responder = Callable[[list[ModelMessage], AgentInfo], ModelResponse]


@pytest.fixture(params=['memory', 'sqlite'])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StepStore]:
    """A fresh store: in memory, and a SQLite file (the persistent path, with media kept in the database)."""
    built: StepStore = (
        InMemoryStepStore() if request.param == 'memory' else SqliteStepStore(database=tmp_path / 'runs.db')
    )
    yield built
    await built.aclose()


class _RewriteFinalHistory(AbstractCapability[Any]):
    """Replaces the final response's text in place in `after_run` (a same-length rewrite)."""

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        messages = result.all_messages()
        messages[-1] = ModelResponse(parts=[TextPart('rewritten')])
        return result


class TestCapabilityScenarios:
    """Each way a run can go, and what the store holds afterwards."""

    # --- a clean run ---------------------------------------------------------------------------

    async def test_tool_cycle_records_events_snapshots_and_ledger(self, store: StepStore) -> None:
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

        result = await agent.run('add 1 and 2', conversation_id='conv-1')
        run_id = result.run_id
        record = await store.get_run(run_id)
        assert record is not None
        assert (record.agent_name, record.conversation_id, record.parent_run_id) == ('adder', 'conv-1', None)
        assert record.registration_id is not None

        events = await store.list_events(run_id)
        assert event_kinds(events) == list(ONE_TOOL_CALL_RUN_EVENTS)
        assert all(e.conversation_id == 'conv-1' for e in events)
        assert all(e.agent_name == 'adder' for e in events)
        assert all(e.idempotency_key for e in events)
        assert len({e.idempotency_key for e in events}) == len(events)
        tool_events = [e for e in events if e.tool_call_id is not None]
        assert {(e.tool_name, e.tool_call_id) for e in tool_events} == {('add', 'c1')}

        snapshots = await store.list_snapshots(run_id, include_interrupted=True)
        assert [s.state for s in snapshots] == [SnapshotState.COMPLETE, SnapshotState.COMPLETE]
        first, final = snapshots
        # The first boundary folds in the tool return before the next request is sent.
        assert isinstance(first.messages[-1], ModelRequest)
        assert isinstance(first.messages[-1].parts[0], ToolReturnPart)
        assert first.messages[-1].parts[0].content == 3
        assert first.step_index == 1
        assert encoded(final.messages) == encoded(result.all_messages())
        assert final.step_index == 2
        assert len({s.idempotency_key for s in snapshots}) == 2

        effects = await store.list_tool_effects(run_id)
        assert [(e.tool_name, e.status, e.args) for e in effects] == [
            ('add', ToolEffectStatus.COMPLETED, {'a': 1, 'b': 2})
        ]
        assert await store.list_unresolved_tool_effects(run_id) == []
        assert encoded(await continue_run(store, run_id=run_id)) == encoded(result.all_messages())

    async def test_run_without_tools_saves_one_snapshot(self, store: StepStore) -> None:
        agent = Agent(
            function_model(script(ModelResponse(parts=[TextPart('hi')]))), capabilities=[StepPersistence(store=store)]
        )
        result = await agent.run('hello')
        snapshots = await store.list_snapshots(result.run_id, include_interrupted=True)
        assert len(snapshots) == 1
        assert snapshots[0].state is SnapshotState.COMPLETE
        assert encoded(snapshots[0].messages) == encoded(result.all_messages())

    async def test_parallel_tool_calls_each_get_a_ledger_entry(self, store: StepStore) -> None:
        agent = Agent(
            function_model(
                script(
                    ModelResponse(
                        parts=[
                            tool_call('lookup', 'p1', key='a'),
                            tool_call('lookup', 'p2', key='b'),
                            tool_call('lookup', 'p3', key='c'),
                        ]
                    ),
                    ModelResponse(parts=[TextPart('done')]),
                )
            ),
            capabilities=[StepPersistence(store=store)],
        )

        @agent.tool
        async def lookup(ctx: RunContext[Any], key: str) -> str:  # pyright: ignore[reportUnusedFunction]
            await asyncio.sleep(0)
            await annotate_tool_effect(store, ctx, idempotency_key=f'lookup-{key}')
            await asyncio.sleep(0)
            return key.upper()

        result = await agent.run('look them up')
        effects = {e.tool_call_id: e for e in await store.list_tool_effects(result.run_id)}
        assert set(effects) == {'p1', 'p2', 'p3'}
        assert all(e.status is ToolEffectStatus.COMPLETED for e in effects.values())
        assert effects['p2'].args == {'key': 'b'}
        assert {i: e.idempotency_key for i, e in effects.items()} == {
            'p1': 'lookup-a',
            'p2': 'lookup-b',
            'p3': 'lookup-c',
        }
        events = await store.list_events(result.run_id)
        for call_id in ('p1', 'p2', 'p3'):
            kinds = [e.kind for e in events if e.tool_call_id == call_id]
            assert kinds == [EventKind.TOOL_CALL_STARTED, EventKind.TOOL_CALL_COMPLETED]
        boundary = (await store.list_snapshots(result.run_id, include_interrupted=True))[0]
        returns = [p for p in boundary.messages[-1].parts if isinstance(p, ToolReturnPart)]
        assert sorted(p.tool_call_id for p in returns) == ['p1', 'p2', 'p3']
        assert boundary.state is SnapshotState.COMPLETE

    # --- failures ------------------------------------------------------------------------------

    async def test_tool_raising_leaves_failed_effect_and_interrupted_snapshot(self, store: StepStore) -> None:
        agent = Agent(
            function_model(
                script(
                    ModelResponse(parts=[tool_call('ok', 'c1')]),
                    ModelResponse(parts=[tool_call('ok', 'c2'), tool_call('boom', 'c3')]),
                    ModelResponse(parts=[TextPart('never')]),
                )
            ),
            capabilities=[StepPersistence(store=store, run_id='tool-raises')],
        )

        @agent.tool_plain
        def ok() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'fine'

        @agent.tool_plain
        def boom() -> str:  # pyright: ignore[reportUnusedFunction]
            raise RuntimeError('disk on fire')

        with pytest.raises(RuntimeError, match='disk on fire'):
            await agent.run('go')

        effects = {e.tool_call_id: e for e in await store.list_tool_effects('tool-raises')}
        assert effects['c1'].status is ToolEffectStatus.COMPLETED
        assert effects['c3'].status is ToolEffectStatus.FAILED
        assert effects['c3'].error is not None
        assert 'disk on fire' in effects['c3'].error
        events = await store.list_events('tool-raises')
        assert events[-1].kind is EventKind.RUN_FAILED
        assert events[-1].error is not None
        assert 'disk on fire' in events[-1].error
        assert [e.kind for e in events if e.tool_call_id == 'c3'] == [
            EventKind.TOOL_CALL_STARTED,
            EventKind.TOOL_CALL_FAILED,
        ]

        newest = await store.latest_snapshot('tool-raises', include_interrupted=True)
        assert newest is not None
        assert newest.state is SnapshotState.INTERRUPTED
        calls = [
            p.tool_call_id
            for m in newest.messages
            if isinstance(m, ModelResponse)
            for p in m.parts
            if isinstance(p, ToolCallPart)
        ]
        assert calls == ['c1', 'c2', 'c3']
        assert not is_provider_valid(newest.messages)
        # The default read path stops at the last settled cycle.
        settled = await continue_run(store, run_id='tool-raises')
        assert is_provider_valid(settled)
        assert [p.tool_call_id for p in settled[-1].parts if isinstance(p, ToolReturnPart)] == ['c1']
        report = await inspect_recovery(store=store, run_id='tool-raises')
        assert report.failed_tools == ('boom',)
        assert 'ok' in report.completed_tools
        # c2 returned, but its result is in no complete snapshot: it stays to be checked.
        assert [e.tool_call_id for e in report.unresolved_effects] == ['c2']
        assert report.interrupted

    async def test_model_error_after_clean_cycle_saves_complete_snapshot(self, store: StepStore) -> None:
        agent = Agent(
            function_model(script(ModelResponse(parts=[tool_call('ok', 'c1')]), ConnectionError('provider down'))),
            capabilities=[StepPersistence(store=store, run_id='model-fails')],
        )

        @agent.tool_plain
        def ok() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'fine'

        with pytest.raises(ConnectionError):
            await agent.run('go')
        newest = await store.latest_snapshot('model-fails', include_interrupted=True)
        settled = await store.latest_snapshot('model-fails')
        assert newest is not None
        assert settled is not None
        assert newest.state is SnapshotState.COMPLETE
        assert newest.seq == settled.seq
        assert isinstance(newest.messages[-1], ModelRequest)
        assert any(isinstance(p, ToolReturnPart) for p in newest.messages[-1].parts)
        kinds = event_kinds(await store.list_events('model-fails'))
        assert kinds[-2:] == [EventKind.MODEL_REQUEST_FAILED, EventKind.RUN_FAILED]

    async def test_model_error_mid_tool_cycle_saves_interrupted_snapshot(self, store: StepStore) -> None:
        delegate = Agent(
            function_model(script(ConnectionError('delegate provider down'))),
            capabilities=[StepPersistence(store=store, run_id='mid-cycle-delegate')],
        )
        agent = Agent(
            function_model(
                script(
                    ModelResponse(parts=[tool_call('ok', 'c1')]),
                    ModelResponse(parts=[tool_call('ok', 'c2'), tool_call('ask', 'c3', question='why?')]),
                    ModelResponse(parts=[TextPart('never')]),
                )
            ),
            capabilities=[StepPersistence(store=store, run_id='mid-cycle')],
        )

        @agent.tool_plain
        def ok() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'fine'

        @agent.tool_plain
        async def ask(question: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return (await delegate.run(question)).output

        with pytest.raises(ConnectionError, match='delegate provider down'):
            await agent.run('go')
        newest = await store.latest_snapshot('mid-cycle', include_interrupted=True)
        assert newest is not None
        assert newest.state is SnapshotState.INTERRUPTED
        settled = await store.latest_snapshot('mid-cycle')
        assert settled is not None
        assert [p.tool_call_id for p in settled.messages[-1].parts if isinstance(p, ToolReturnPart)] == ['c1']
        effects = {e.tool_call_id: e.status for e in await store.list_tool_effects('mid-cycle')}
        assert effects['c3'] is ToolEffectStatus.FAILED
        delegate_run = await store.get_run('mid-cycle-delegate')
        assert delegate_run is not None
        assert delegate_run.parent_run_id == 'mid-cycle'
        delegate_kinds = event_kinds(await store.list_events('mid-cycle-delegate'))
        assert delegate_kinds[-2:] == [EventKind.MODEL_REQUEST_FAILED, EventKind.RUN_FAILED]
        assert event_kinds(await store.list_events('mid-cycle'))[-1] is EventKind.RUN_FAILED

    async def test_model_error_on_first_request_saves_nothing_without_frontier(self, store: StepStore) -> None:
        agent = Agent(
            function_model(script(ConnectionError('provider down'))),
            capabilities=[StepPersistence(store=store, run_id='r0')],
        )
        with pytest.raises(ConnectionError):
            await agent.run('go')
        assert await store.list_snapshots('r0', include_interrupted=True) == []
        with pytest.raises(LookupError, match='r0'):
            await continue_run(store, run_id='r0', include_interrupted=True)

    async def test_capture_frontier_keeps_first_prompt_and_proposed_calls(self, store: StepStore) -> None:
        agent = Agent(
            function_model(script(ConnectionError('provider down'))),
            capabilities=[StepPersistence(store=store, run_id='f0', capture_frontier=True)],
        )
        with pytest.raises(ConnectionError):
            await agent.run('remember this prompt')
        newest = await store.latest_snapshot('f0', include_interrupted=True)
        assert newest is not None
        # The prompt alone has no tool call to settle: the checkpoint before the request is complete.
        assert newest.state is SnapshotState.COMPLETE
        assert [p.content for p in newest.messages[0].parts if isinstance(p, UserPromptPart)] == [
            'remember this prompt'
        ]
        assert await store.latest_snapshot('f0') == newest

        proposed = Agent(
            function_model(
                script(ModelResponse(parts=[tool_call('ok', 'c1', x=1)]), ModelResponse(parts=[TextPart('done')]))
            ),
            capabilities=[StepPersistence(store=store, run_id='f1', capture_frontier=True)],
        )

        @proposed.tool_plain
        def ok(x: int) -> int:  # pyright: ignore[reportUnusedFunction]
            return x

        result = await proposed.run('go')
        snapshots = await store.list_snapshots('f1', include_interrupted=True)
        frontier = [s for s in snapshots if s.state is SnapshotState.INTERRUPTED]
        assert any(
            isinstance(s.messages[-1], ModelResponse) and s.messages[-1].parts[0] == tool_call('ok', 'c1', x=1)
            for s in frontier
        )
        assert snapshots[-1].state is SnapshotState.COMPLETE
        assert encoded(await continue_run(store, run_id='f1')) == encoded(result.all_messages())

    # --- other ways to drive a run -------------------------------------------------------------

    async def test_run_stream_saves_closing_response(self, store: StepStore) -> None:
        agent = Agent(
            function_model(
                script(ModelResponse(parts=[tool_call('ok', 'c1')]), ModelResponse(parts=[TextPart('streamed answer')]))
            ),
            capabilities=[StepPersistence(store=store, run_id='streamed')],
        )

        @agent.tool_plain
        def ok() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'fine'

        async with agent.run_stream('go') as stream:
            output = await stream.get_output()
            messages = stream.all_messages()
        assert output == 'streamed answer'
        latest = await store.latest_snapshot('streamed')
        assert latest is not None
        assert encoded(latest.messages) == encoded(messages)
        assert isinstance(latest.messages[-1], ModelResponse)
        assert event_kinds(await store.list_events('streamed'))[-1] is EventKind.RUN_COMPLETED

    async def test_iter_records_like_run(self, store: StepStore) -> None:
        agent = Agent(
            function_model(
                script(ModelResponse(parts=[tool_call('ok', 'c1')]), ModelResponse(parts=[TextPart('done')]))
            ),
            capabilities=[StepPersistence(store=store, run_id='iterated')],
        )

        @agent.tool_plain
        def ok() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'fine'

        async with agent.iter('go') as run:
            async for _node in run:
                pass
            assert run.result is not None
            messages = run.result.all_messages()
        snapshots = await store.list_snapshots('iterated', include_interrupted=True)
        assert [s.state for s in snapshots] == [SnapshotState.COMPLETE, SnapshotState.COMPLETE]
        assert encoded(snapshots[-1].messages) == encoded(messages)
        assert [e.status for e in await store.list_tool_effects('iterated')] == [ToolEffectStatus.COMPLETED]

    # --- history rewrites ----------------------------------------------------------------------

    async def test_history_processor_trim_is_stored_as_trimmed(self, store: StepStore) -> None:
        def keep_last_three(messages: list[ModelMessage]) -> list[ModelMessage]:
            return messages[-3:] if len(messages) > 3 else messages

        replies = iter(
            [
                ModelResponse(parts=[tool_call('ok', 'c1')]),
                ModelResponse(parts=[tool_call('ok', 'c2')]),
                ModelResponse(parts=[TextPart('done')]),
            ]
        )
        agent = Agent(
            function_model(lambda messages, info: next(replies)),
            capabilities=[StepPersistence(store=store, run_id='trimmed'), ProcessHistory(keep_last_three)],
        )

        @agent.tool_plain
        def ok() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'fine'

        result = await agent.run('go')
        newest = await store.latest_snapshot('trimmed', include_interrupted=True)
        assert newest is not None
        assert encoded(newest.messages) == encoded(result.all_messages())
        # The trim cut the call its first tool return answers: a provider would refuse that
        # history, so it is stored `interrupted` and the settled read stays on the untrimmed one.
        assert newest.state is SnapshotState.INTERRUPTED
        settled = await store.latest_snapshot('trimmed')
        assert settled is not None
        assert isinstance(settled.messages[0].parts[0], UserPromptPart)
        assert is_provider_valid(settled.messages)
        snapshots = await store.list_snapshots('trimmed', include_interrupted=True)
        # The first boundary kept its untrimmed history: rewriting later never alters it.
        assert isinstance(snapshots[0].messages[0].parts[0], UserPromptPart)
        assert len(snapshots[0].messages) == 3

    async def test_same_length_rewrite_in_after_run_is_saved(self, store: StepStore) -> None:
        agent = Agent(
            function_model(script(ModelResponse(parts=[TextPart('original')]))),
            capabilities=[StepPersistence(store=store, run_id='rewritten'), _RewriteFinalHistory()],
        )
        result = await agent.run('go')
        snapshots = await store.list_snapshots('rewritten', include_interrupted=True)
        assert len(snapshots) == 2
        assert snapshots[0].messages[-1].parts[0] == TextPart('original')
        assert snapshots[1].messages[-1].parts[0] == TextPart('rewritten')
        assert encoded(snapshots[1].messages) == encoded(result.all_messages())

    # --- continuing ----------------------------------------------------------------------------

    async def test_continue_with_new_prompt_and_fork(self, store: StepStore) -> None:
        def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            prompts = [
                p.content
                for m in messages
                if isinstance(m, ModelRequest)
                for p in m.parts
                if isinstance(p, UserPromptPart)
            ]
            return ModelResponse(parts=[TextPart(' | '.join(str(p) for p in prompts))])

        agent = Agent(function_model(respond), capabilities=[StepPersistence(store=store, agent_name='librarian')])
        first = await agent.run('find it', conversation_id='libr-conv')
        prior = (await store.list_runs(conversation_id='libr-conv'))[-1].run_id
        assert prior != first.run_id  # derived from agent_name and the context run id
        history = await continue_run(store, run_id=prior)
        second = await agent.run('and the path?', message_history=history, conversation_id='libr-conv')
        assert second.output == 'find it | and the path?'
        runs = await store.list_runs(conversation_id='libr-conv')
        assert len(runs) == 2
        assert runs[0].run_id == prior
        forked = await agent.run('other question', message_history=await fork_run(store, run_id=prior))
        assert forked.output == 'find it | other question'
        assert forked.run_id not in (first.run_id, second.run_id)

    async def test_resume_interrupted_history(self, store: StepStore) -> None:
        attempts: list[str] = []

        def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            if count_requests(messages) == 1:
                return ModelResponse(parts=[tool_call('flaky', 'c1')])
            return ModelResponse(parts=[TextPart('resumed')])

        agent = Agent(function_model(respond), capabilities=[StepPersistence(store=store, capture_frontier=True)])

        @agent.tool_plain
        def flaky() -> str:  # pyright: ignore[reportUnusedFunction]
            attempts.append('call')
            if len(attempts) == 1:
                raise RuntimeError('transient')
            return 'worked'

        with pytest.raises(RuntimeError, match='transient'):
            await agent.run('go', conversation_id='resume-conv')
        failed_run = (await store.list_runs(conversation_id='resume-conv'))[-1].run_id
        # The only settled point is the checkpoint of the prompt, taken before the first request.
        [prompt_only] = await continue_run(store, run_id=failed_run)
        assert isinstance(prompt_only, ModelRequest)

        # The at-failure history ends in the interrupted request of the failed cycle; a new prompt
        # closes the call out with a synthesized return instead of running it again.
        at_failure = await continue_run(store, run_id=failed_run, include_interrupted=True)
        assert not is_provider_valid(at_failure)
        assert isinstance(at_failure[-1], ModelRequest)
        closed = await agent.run('new question', message_history=at_failure)
        assert closed.output == 'resumed'
        assert attempts == ['call']

        # The frontier snapshot ends in the proposed call itself.
        [frontier] = [
            s
            for s in await store.list_snapshots(failed_run, include_interrupted=True)
            if isinstance(s.messages[-1], ModelResponse)
        ]
        assert frontier.state is SnapshotState.INTERRUPTED
        history = frontier.messages
        # With a new prompt and none of the batch answered, pydantic-ai refuses to abandon the call.
        with pytest.raises(UserError):
            await agent.run('new question', message_history=history)
        # Repairing closes the call out, after which a new prompt is accepted.
        repaired = repair_messages(history)
        assert is_provider_valid(repaired)
        assert (await agent.run('new question', message_history=repaired)).output == 'resumed'
        assert attempts == ['call']

        # Without a new prompt, the pending call is executed.
        resumed = await agent.run(message_history=history)
        assert resumed.output == 'resumed'
        assert attempts == ['call', 'call']
        effects = await store.list_tool_effects(resumed.run_id)
        assert [(e.tool_call_id, e.status) for e in effects] == [('c1', ToolEffectStatus.COMPLETED)]

    # --- notifications -------------------------------------------------------------------------

    async def test_snapshot_saved_is_delivered_for_every_write(self, store: StepStore) -> None:
        seen: list[SnapshotSaved] = []
        hooks = Hooks[Any]()

        @hooks.on.event(SnapshotSaved)
        async def collect(ctx: RunContext[Any], event: SnapshotSaved) -> None:  # pyright: ignore[reportUnusedFunction]
            seen.append(event)

        agent = Agent(
            function_model(
                script(ModelResponse(parts=[tool_call('ok', 'c1')]), ModelResponse(parts=[TextPart('original')]))
            ),
            capabilities=[StepPersistence(store=store, run_id='notified'), _RewriteFinalHistory(), hooks],
        )

        @agent.tool_plain
        def ok() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'fine'

        await agent.run('go', conversation_id='n-conv')
        snapshots = await store.list_snapshots('notified', include_interrupted=True)
        assert len(snapshots) == 3  # boundary, final response, after_run rewrite
        assert [(e.persistence_run_id, e.step_index, e.state) for e in seen] == [
            ('notified', s.step_index, s.state) for s in snapshots
        ]
        assert all(e.conversation_id == 'n-conv' for e in seen)
        assert all(e.kind == 'step_persistence.snapshot_saved' for e in seen)

        failing = Agent(
            function_model(script(ModelResponse(parts=[tool_call('ok', 'c1')]), ConnectionError('down'))),
            capabilities=[StepPersistence(store=store, run_id='notified-failure'), hooks],
        )
        failing.tool_plain(ok)
        seen.clear()
        with pytest.raises(ConnectionError):
            await failing.run('go')
        assert [e.persistence_run_id for e in seen] == ['notified-failure', 'notified-failure']
        assert len(await store.list_snapshots('notified-failure', include_interrupted=True)) == 2

    # --- identity and lineage ------------------------------------------------------------------

    async def test_explicit_run_id_is_single_use(self, store: StepStore) -> None:
        capability = StepPersistence(store=store, run_id='libr-1')
        agent = Agent(function_model(script(ModelResponse(parts=[TextPart('ok')]))), capabilities=[capability])
        result = await agent.run('one')
        assert (await store.get_run('libr-1')) is not None
        assert result.run_id != 'libr-1'
        with pytest.raises(ValueError, match='libr-1'):
            await agent.run('two')
        assert event_kinds(await store.list_events('libr-1')) == [
            EventKind.RUN_STARTED,
            EventKind.MODEL_REQUEST_STARTED,
            EventKind.MODEL_REQUEST_COMPLETED,
            EventKind.RUN_COMPLETED,
        ]

    async def test_run_ids_per_call_and_conversation_grouping(self, store: StepStore) -> None:
        agent = Agent(
            function_model(script(ModelResponse(parts=[TextPart('ok')]))),
            name='orchestrator_agent',
            capabilities=[StepPersistence(store=store)],
        )
        results = [await agent.run(f'turn {i}', conversation_id='orch-conv') for i in range(3)]
        runs = await store.list_runs(conversation_id='orch-conv')
        assert [r.run_id for r in runs] == [r.run_id for r in results]  # ctx.run_id, chronological
        assert {r.agent_name for r in runs} == {'orchestrator_agent'}

    async def test_delegation_three_levels_sets_parent_chain(self, store: StepStore) -> None:
        def delegate_then_answer(tool: str) -> Responder:
            return script(
                ModelResponse(parts=[tool_call(tool, f'{tool}-call', question='q')]),
                ModelResponse(parts=[TextPart('answer')]),
            )

        leaf = Agent(
            function_model(script(ModelResponse(parts=[TextPart('leaf answer')]))),
            capabilities=[StepPersistence(store=store, agent_name='leaf')],
        )
        middle = Agent(
            function_model(delegate_then_answer('ask_leaf')),
            capabilities=[StepPersistence(store=store, agent_name='middle')],
        )
        top = Agent(
            function_model(delegate_then_answer('ask_middle')),
            capabilities=[StepPersistence(store=store, agent_name='top')],
        )

        @middle.tool_plain
        async def ask_leaf(question: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return (await leaf.run(question)).output

        @top.tool_plain
        async def ask_middle(question: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return (await middle.run(question)).output

        await top.run('start', conversation_id='tree')
        top_run = (await store.list_runs(conversation_id='tree'))[-1]
        assert top_run.parent_run_id is None
        assert top_run.agent_name == 'top'
        [middle_run] = await store.list_runs(parent_run_id=top_run.run_id)
        assert middle_run.agent_name == 'middle'
        [leaf_run] = await store.list_runs(parent_run_id=middle_run.run_id)
        assert leaf_run.agent_name == 'leaf'
        leaf_events = await store.list_events(leaf_run.run_id)
        assert {e.parent_run_id for e in leaf_events} == {middle_run.run_id}
        # A later top-level run has no parent: the scope ends with the run.
        await leaf.run('alone', conversation_id='alone')
        assert (await store.list_runs(conversation_id='alone'))[-1].parent_run_id is None
        # An explicit parent wins over the inferred one.
        explicit = Agent(
            function_model(script(ModelResponse(parts=[TextPart('x')]))),
            capabilities=[StepPersistence(store=store, parent_run_id='remote-orchestrator')],
        )
        await explicit.run('x')
        assert len(await store.list_runs(parent_run_id='remote-orchestrator')) == 1

    # --- tool effect annotations ---------------------------------------------------------------

    async def test_annotate_tool_effect_survives_terminal_write(self, store: StepStore) -> None:
        agent = Agent(
            function_model(
                script(
                    ModelResponse(parts=[tool_call('set_label', 'c1', issue=7, label='bug')]),
                    ModelResponse(parts=[TextPart('done')]),
                )
            ),
            capabilities=[StepPersistence(store=store, run_id='annotated')],
        )
        seen_in_flight: list[Any] = []

        @agent.tool
        async def set_label(ctx: RunContext[Any], issue: int, label: str) -> str:  # pyright: ignore[reportUnusedFunction]
            await annotate_tool_effect(
                store,
                ctx,
                idempotency_key=f'issue-{issue}::label::{label}',
                effect_summary=f'set label {label!r} on #{issue}',
            )
            seen_in_flight.append(await store.get_tool_effect('annotated', 'c1'))
            return 'ok'

        await agent.run('label it')
        [in_flight] = seen_in_flight
        assert in_flight.status is ToolEffectStatus.STARTED
        assert in_flight.idempotency_key == 'issue-7::label::bug'
        final = await store.get_tool_effect('annotated', 'c1')
        assert final is not None
        assert final.status is ToolEffectStatus.COMPLETED
        assert (final.idempotency_key, final.effect_summary) == ('issue-7::label::bug', "set label 'bug' on #7")

        # Outside a wrapped tool call it does nothing.
        plain = Agent(
            function_model(
                script(ModelResponse(parts=[tool_call('note', 'n1')]), ModelResponse(parts=[TextPart('done')]))
            )
        )

        @plain.tool
        async def note(ctx: RunContext[Any]) -> str:  # pyright: ignore[reportUnusedFunction]
            await annotate_tool_effect(store, ctx, idempotency_key='k', effect_summary='s')
            return 'ok'

        result = await plain.run('go')
        assert await store.list_tool_effects(result.run_id) == []
