"""The capability and recovery helpers behave as pydantic-ai-harness 0.62.0 does.

Every expected value below was read off the same scenario run against pydantic-ai-harness 0.62.0
(with pydantic-ai 2.62); each scenario runs on the in-memory store and on a SQLite file.
"""

from __future__ import annotations

import asyncio
import re
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import Hooks, ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    RetryPromptPart,  # pyright: ignore[reportDeprecated]
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.models.test import TestModel

from step_file import FileStepStore
from step_sqlite import SqliteStepStore
from stepcore import (
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
from stepcore.capability.settled import SettledTracker
from stepcore.recovery import RecoveryInspection, RecoveryReport
from stepcore.store.ids import derive_run_id, dotted_run_id
from stepcore_conformance.capability import encoded, function_model, script, tool_call


@pytest.fixture(params=['memory', 'sqlite'])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StepStore]:
    built: StepStore = (
        InMemoryStepStore() if request.param == 'memory' else SqliteStepStore(database=tmp_path / 'runs.db')
    )
    yield built
    await built.aclose()


def _prompts(messages: list[ModelMessage]) -> list[str]:
    return [
        str(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]


async def _run(
    agent: Agent[Any, str], prompt: str, *, streamed: bool, message_history: list[ModelMessage] | None = None
) -> None:
    """`agent.run`, or `agent.run_stream` read to the end."""
    if streamed:
        async with agent.run_stream(prompt, message_history=message_history) as stream:
            await stream.get_output()
    else:
        await agent.run(prompt, message_history=message_history)


# --- 1. is_provider_valid is strict --------------------------------------------------------------

# Each history as steps: ('call', ids...) a response calling tools; ('return', ids...) a request with
# tool returns; ('retried', id) a return with outcome='retried'; ('retry', id, tool_name or None) a
# legacy retry prompt; ('text',) a text response. The verdicts are pydantic-ai-harness's.
VALIDITY_TABLE: list[tuple[str, list[tuple[Any, ...]], bool]] = [
    ('empty', [], True),
    ('text only', [('text',)], True),
    ('calls answered', [('call', 'a', 'b'), ('return', 'a', 'b')], True),
    ('a call left open', [('call', 'a', 'b'), ('return', 'a')], False),
    ('a return never called', [('return', 'x')], False),
    ('an orphan after a settled pair', [('call', 'a'), ('return', 'a'), ('return', 'z')], False),
    ('answered twice', [('call', 'a'), ('return', 'a'), ('return', 'a')], False),
    ('answered twice in one request', [('call', 'a'), ('return', 'a', 'a')], False),
    ('answer before its call', [('return', 'a'), ('call', 'a')], False),
    ('tool retry prompt answers', [('call', 'a'), ('retry', 'a', 't')], True),
    ('tool retry prompt never called', [('retry', 'q', 't')], False),
    ('retry prompt without tool', [('retry', 'q', None)], True),
    ('retry prompt without tool answers nothing', [('call', 'a'), ('retry', 'a', None)], False),
    ('id reused after its answer', [('call', 'a'), ('return', 'a'), ('call', 'a'), ('return', 'a')], True),
    ('id reused and left open', [('call', 'a'), ('return', 'a'), ('call', 'a')], False),
    ('same id called twice, answered once', [('call', 'a'), ('call', 'a'), ('return', 'a')], True),
    ('retried return answers', [('call', 'a'), ('retried', 'a')], True),
]


def _history(steps: list[tuple[Any, ...]]) -> list[ModelMessage]:
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hi')])]
    for kind, *args in steps:
        if kind == 'text':
            history.append(ModelResponse(parts=[TextPart('hello')]))
        elif kind == 'call':
            history.append(ModelResponse(parts=[ToolCallPart('t', {}, tool_call_id=i) for i in args]))
        elif kind == 'return':
            history.append(ModelRequest(parts=[ToolReturnPart('t', 'ok', tool_call_id=i) for i in args]))
        elif kind == 'retried':
            history.append(ModelRequest(parts=[ToolReturnPart('t', 'again', tool_call_id=args[0], outcome='retried')]))
        else:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')  # the part is deprecated; histories may still hold it
                part: ModelRequestPart = RetryPromptPart('again', tool_name=args[1], tool_call_id=args[0])  # pyright: ignore[reportDeprecated]
            history.append(ModelRequest(parts=[part]))
    return history


@pytest.mark.parametrize(('name', 'steps', 'valid'), VALIDITY_TABLE, ids=[row[0] for row in VALIDITY_TABLE])
def test_is_provider_valid_matches_the_reference(name: str, steps: list[tuple[Any, ...]], valid: bool) -> None:
    history = _history(steps)
    assert is_provider_valid(history) is valid
    # The incremental check the capability uses agrees, scanning the history as it grows.
    tracker = SettledTracker()
    for end in range(1, len(history) + 1):
        assert tracker.is_provider_valid(history[:end]) is is_provider_valid(history[:end])


def test_an_orphan_answer_stays_invalid_once_scanned_past() -> None:
    tracker = SettledTracker()
    history = _history([('return', 'ghost'), ('call', 'a'), ('return', 'a')])
    for i in range(6):
        history = [*history, *_history([('call', f'c{i}'), ('return', f'c{i}')])[1:]]
        assert tracker.is_provider_valid(history) is False


async def test_a_history_whose_trim_orphans_a_return_is_not_settled(store: StepStore) -> None:
    """A processor that cuts a tool call but keeps its return leaves a history a provider refuses."""

    def keep_last_three(messages: list[ModelMessage]) -> list[ModelMessage]:
        return messages[-3:] if len(messages) > 3 else messages

    # One reply per request, in order (the trimmed history no longer tells how far the run is).
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
    final = result.all_messages()
    assert not is_provider_valid(final)  # it starts with the return of a call that was cut
    snapshots = await store.list_snapshots('trimmed', include_interrupted=True)
    assert [(s.state, is_provider_valid(s.messages)) for s in snapshots] == [
        (SnapshotState.COMPLETE, True),
        (SnapshotState.COMPLETE, True),
        (SnapshotState.INTERRUPTED, False),
    ]
    # continue_run and fork_run read the newest settled history, the last one before the trim.
    settled = await continue_run(store, run_id='trimmed')
    assert encoded(settled) == encoded(snapshots[1].messages)
    assert encoded(await fork_run(store, run_id='trimmed')) == encoded(settled)
    assert encoded(await fork_run(store, run_id='trimmed', include_interrupted=True)) == encoded(final)


async def test_a_clean_run_still_settles_each_cycle(store: StepStore) -> None:
    agent = Agent(
        function_model(
            script(
                ModelResponse(parts=[tool_call('ok', 'c1')]),
                ModelResponse(parts=[tool_call('ok', 'c2')]),
                ModelResponse(parts=[TextPart('done')]),
            )
        ),
        capabilities=[StepPersistence(store=store, run_id='clean', capture_frontier=True)],
    )

    @agent.tool_plain
    def ok() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'fine'

    result = await agent.run('go')
    snapshots = await store.list_snapshots('clean')
    assert all(s.state is SnapshotState.COMPLETE for s in snapshots if is_provider_valid(s.messages))
    assert all(s.state is SnapshotState.INTERRUPTED for s in snapshots if not is_provider_valid(s.messages))
    assert encoded(await continue_run(store, run_id='clean')) == encoded(result.all_messages())
    assert [e.status for e in await store.list_tool_effects('clean')] == [ToolEffectStatus.COMPLETED] * 2


# --- 3. the input checkpoint when the first request fails ----------------------------------------


@pytest.mark.parametrize('streamed', [False, True], ids=['run', 'run_stream'])
async def test_first_request_failure_keeps_the_prompt_with_capture_frontier(store: StepStore, streamed: bool) -> None:
    seen: list[tuple[SnapshotState, list[str]]] = []
    hooks = Hooks[Any]()

    @hooks.on.event(SnapshotSaved)
    async def saved(ctx: RunContext[Any], event: SnapshotSaved) -> None:  # pyright: ignore[reportUnusedFunction]
        stored = await store.latest_snapshot(event.persistence_run_id, include_interrupted=True)
        assert stored is not None
        seen.append((event.state, _prompts(stored.messages)))

    agent = Agent(
        function_model(script(ConnectionError('provider down'))),
        capabilities=[StepPersistence(store=store, run_id='first', capture_frontier=True), hooks],
    )
    with pytest.raises(ConnectionError):
        await _run(agent, 'remember this', streamed=streamed)

    # Read back from the store inside the listener: the write came first.
    assert seen == [(SnapshotState.COMPLETE, ['remember this'])]
    history = await continue_run(store, run_id='first')
    assert len(history) == 1
    assert _prompts(history) == ['remember this']


async def test_first_request_failure_saves_nothing_without_capture_frontier(store: StepStore) -> None:
    agent = Agent(
        function_model(script(ConnectionError('provider down'))),
        capabilities=[StepPersistence(store=store, run_id='bare')],
    )
    with pytest.raises(ConnectionError):
        await agent.run('go')
    assert await store.list_snapshots('bare') == []


# --- 4. a resumed run whose first request fails --------------------------------------------------


@pytest.mark.parametrize('capture_frontier', [False, True], ids=['plain', 'capture_frontier'])
@pytest.mark.parametrize('streamed', [False, True], ids=['run', 'run_stream'])
async def test_resumed_run_whose_first_request_fails_saves_exactly_the_prior_history(
    store: StepStore, streamed: bool, capture_frontier: bool
) -> None:
    down = False
    seen_prompts: list[list[str]] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if down:
            raise ConnectionError('provider down')
        seen_prompts.append(_prompts(messages))
        if len(messages) == 1:
            return ModelResponse(parts=[tool_call('ok', 'c1')])
        return ModelResponse(parts=[TextPart('answered ' + ' | '.join(_prompts(messages)))])

    def agent(run_id: str) -> Agent[None, str]:
        built = Agent(
            function_model(respond),
            capabilities=[StepPersistence(store=store, run_id=run_id, capture_frontier=capture_frontier)],
        )

        @built.tool_plain
        def ok() -> str:  # pyright: ignore[reportUnusedFunction]
            return 'fine'

        return built

    prior = (await agent('before').run('first')).all_messages()
    prior_encoded = encoded(prior)
    down = True
    with pytest.raises(ConnectionError):
        await _run(agent('resumed'), 'new prompt', streamed=streamed, message_history=prior)

    history = await continue_run(store, run_id='resumed')
    assert encoded(history) == prior_encoded
    assert 'new prompt' not in _prompts(history)

    # Resuming and passing the prompt again sends it once.
    down = False
    result = await agent('again').run('new prompt', message_history=history)
    assert result.output == 'answered first | new prompt'
    assert seen_prompts[-1] == ['first', 'new prompt']


# --- 5. from_spec's default locations ------------------------------------------------------------


async def test_from_spec_file_without_directory_uses_step_persistence_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built_in = tmp_path / 'built'
    run_in = tmp_path / 'run'
    built_in.mkdir()
    run_in.mkdir()
    monkeypatch.chdir(built_in)
    capability = StepPersistence.from_spec(backend='file', run_id='spec-file')
    assert isinstance(capability.store, FileStepStore)
    assert capability.store.directory == Path('.step-persistence')
    # Relative, as in pydantic-ai-harness: it lands where the run happens.
    monkeypatch.chdir(run_in)
    await Agent(TestModel(), capabilities=[capability]).run('hi')
    await capability.store.aclose()
    assert (run_in / '.step-persistence' / 'spec-file').is_dir()
    assert list(built_in.iterdir()) == []
    async with FileStepStore(run_in / '.step-persistence') as reopened:
        assert len(await continue_run(reopened, run_id='spec-file')) == 2


async def test_from_spec_sqlite_without_database_uses_step_persistence_db(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    capability = StepPersistence.from_spec(backend='sqlite', run_id='spec-sqlite')
    await Agent(TestModel(), capabilities=[capability]).run('hi')
    await capability.store.aclose()
    assert (tmp_path / '.step-persistence.db').is_file()
    explicit = StepPersistence.from_spec(backend='file', directory=str(tmp_path / 'elsewhere'))
    assert isinstance(explicit.store, FileStepStore)
    assert explicit.store.directory == tmp_path / 'elsewhere'


def test_from_spec_unknown_backend_says_unknown_backend() -> None:
    with pytest.raises(ValueError, match="unknown backend 'nosuch'"):
        StepPersistence.from_spec(backend='nosuch')


# --- 8. a failed tool call's summary -------------------------------------------------------------


async def test_a_failed_call_summarises_its_error_unless_annotated(store: StepStore) -> None:
    async def annotated(ctx: RunContext[Any]) -> str:
        await annotate_tool_effect(store, ctx, effect_summary='wrote report.md')
        raise KeyError('missing')

    def plain() -> str:
        raise ValueError('disk full')

    for run_id, tool, raised in (('annotated-run', annotated, KeyError), ('plain-run', plain, ValueError)):
        agent = Agent(
            function_model(script(ModelResponse(parts=[tool_call(tool.__name__, 'c1')]))),
            capabilities=[StepPersistence(store=store, run_id=run_id)],
            tools=[tool],
        )
        with pytest.raises(raised):
            await agent.run('go')

    annotated_entry = await store.get_tool_effect('annotated-run', 'c1')
    assert annotated_entry is not None
    assert (annotated_entry.status, annotated_entry.effect_summary, annotated_entry.error) == (
        ToolEffectStatus.FAILED,
        'wrote report.md',
        "KeyError('missing')",
    )
    plain_entry = await store.get_tool_effect('plain-run', 'c1')
    assert plain_entry is not None
    assert (plain_entry.status, plain_entry.effect_summary, plain_entry.error) == (
        ToolEffectStatus.FAILED,
        "ValueError('disk full')",
        "ValueError('disk full')",
    )


# --- inspect_recovery's report -------------------------------------------------------------------


async def test_inspect_recovery_has_the_reference_fields(store: StepStore) -> None:
    agent = Agent(
        function_model(
            script(
                ModelResponse(parts=[tool_call('fine', 'b1')]),
                ModelResponse(parts=[tool_call('fine', 'b2'), tool_call('other', 'b3')]),
                ModelResponse(parts=[tool_call('boom', 'b4')]),
            )
        ),
        capabilities=[StepPersistence(store=store, run_id='inspected')],
    )

    @agent.tool_plain
    def fine() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'ok'

    @agent.tool_plain
    def other() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'ok'

    @agent.tool_plain
    def boom() -> str:  # pyright: ignore[reportUnusedFunction]
        raise ValueError('disk full')

    with pytest.raises(ValueError, match='disk full'):
        await agent.run('go')
    report = await inspect_recovery(store=store, run_id='inspected')
    assert isinstance(report, RecoveryInspection)
    assert report.completed_tools == ('fine', 'other')  # each tool once, first completion first
    assert report.failed_tools == ('boom',)
    assert report.unresolved == ()
    assert report.latest is not None
    assert report.latest.state is SnapshotState.INTERRUPTED
    assert report.settled is not None
    assert report.settled.state is SnapshotState.COMPLETE
    assert report.interrupted
    # stepcore's own names keep working.
    assert report.newest_snapshot == report.latest
    assert report.settled_snapshot == report.settled
    assert report.unresolved_effects == []
    assert report.run is not None
    assert report.run.run_id == 'inspected'
    with pytest.raises(ValidationError):
        report.failed_tools = ()  # pyright: ignore[reportAttributeAccessIssue]
    rebuilt = RecoveryReport.model_validate({'run_id': 'r', 'newest_snapshot': report.latest, 'unresolved_effects': []})
    assert (rebuilt.latest, rebuilt.unresolved) == (report.latest, ())


async def test_inspect_recovery_of_a_call_cut_short_lists_it_unresolved(store: StepStore) -> None:
    reached = asyncio.Event()
    agent = Agent(
        function_model(script(ModelResponse(parts=[tool_call('send', 's1')]))),
        capabilities=[StepPersistence(store=store, run_id='cut')],
    )

    @agent.tool_plain
    async def send() -> str:  # pyright: ignore[reportUnusedFunction]
        reached.set()
        await asyncio.sleep(3600)
        return 'sent'

    task = asyncio.create_task(agent.run('go'))
    await reached.wait()
    task.cancel()  # stands in for a kill in the middle of the call
    with pytest.raises(asyncio.CancelledError):
        await task
    report = await inspect_recovery(store=store, run_id='cut')
    assert isinstance(report.unresolved, tuple)
    assert [(e.tool_call_id, e.status) for e in report.unresolved] == [('s1', ToolEffectStatus.STARTED)]
    assert (report.completed_tools, report.failed_tools) == ((), ())


# --- the per-run copy's run_id -------------------------------------------------------------------


async def test_the_copy_for_run_returns_carries_the_resolved_ids(store: StepStore) -> None:
    copies: list[StepPersistence[Any]] = []
    outer = Agent(
        function_model(
            script(ModelResponse(parts=[tool_call('delegate', 'd1')]), ModelResponse(parts=[TextPart('done')]))
        ),
        name='outer',
        capabilities=[StepPersistence(store=store, run_id='orchestrator')],
    )
    inner = Agent(
        function_model(
            script(ModelResponse(parts=[tool_call('look', 'l1')]), ModelResponse(parts=[TextPart('found')]))
        ),
        name='inner',
        capabilities=[StepPersistence(store=store, agent_name='librarian')],
    )

    @inner.tool
    def look(ctx: RunContext[Any]) -> str:  # pyright: ignore[reportUnusedFunction]
        copies.extend(c for c in ctx.capabilities.values() if isinstance(c, StepPersistence))
        return 'here'

    @outer.tool_plain
    async def delegate() -> str:  # pyright: ignore[reportUnusedFunction]
        return (await inner.run('find it', run_id='inner-context-id')).output

    await outer.run('go')
    [copy] = copies
    assert copy.run_id == 'sp-OTpsaWJyYXJpYW5pbm5lci1jb250ZXh0LWlk'
    assert copy.resolved_run_id == copy.run_id == copy.compaction_transcript_handle()
    assert copy.parent_run_id == 'orchestrator'
    assert copy.agent_name == 'librarian'
    assert await store.get_run(copy.run_id) is not None


# --- derived run ids -----------------------------------------------------------------------------

# (agent_name, context run id, the id pydantic-ai-harness 0.62.0 derives)
DERIVED_IDS: list[tuple[str, str, str]] = [
    (
        'librarian',
        '01a23bc2-08ed-777b-91e2-190b0b71c441',
        'sp-OTpsaWJyYXJpYW4wMWEyM2JjMi0wOGVkLTc3N2ItOTFlMi0xOTBiMGI3MWM0NDE',
    ),
    ('code_librarian', 'run-1', 'sp-MTQ6Y29kZV9saWJyYXJpYW5ydW4tMQ'),
    ('a', 'b', 'sp-MTphYg'),
    ('', 'run-1', 'sp-MDpydW4tMQ'),
    ('agent', '', 'sp-NTphZ2VudA'),
    ('12', '3:x', 'sp-MjoxMjM6eA'),
    ('1', '23:x', 'sp-MToxMjM6eA'),
    ('code librarian/ü', '3f2a:run', 'sp-MTc6Y29kZSBsaWJyYXJpYW4vw7wzZjJhOnJ1bg'),
    ('名前', 'ラン', 'sp-NjrlkI3liY3jg6njg7M'),
    ('..', '../etc/passwd', 'sp-MjouLi4uL2V0Yy9wYXNzd2Q'),
    (
        'x' * 100,
        '0197a6f2-3c1b-7a41-9c55-1f0e8d3b2a10',
        'sp-MTAwOnh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4'
        'eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHgwMTk3YTZmMi0zYzFiLTdhNDEtOWM1NS0xZjBlOGQzYjJhMTA',
    ),
]


@pytest.mark.parametrize(('agent_name', 'context_run_id', 'expected'), DERIVED_IDS)
def test_derived_run_ids_are_the_references(agent_name: str, context_run_id: str, expected: str) -> None:
    assert derive_run_id(agent_name, context_run_id) == expected


def test_a_derived_id_over_200_characters_is_refused_as_the_reference_does() -> None:
    # pydantic-ai-harness refuses this pair too ("exceeds ... 200-character limit").
    with pytest.raises(ValueError, match='exceeds the 200-character limit'):
        derive_run_id('x' * 116, 'abcdefghijklmnopqrstuvwxyz0123')


async def test_a_run_with_agent_name_is_stored_under_the_references_id(store: StepStore) -> None:
    agent = Agent(TestModel(), capabilities=[StepPersistence(store=store, agent_name='librarian')])
    await agent.run('hi', run_id='fixed-run-id')
    assert [r.run_id for r in await store.list_runs()] == ['sp-OTpsaWJyYXJpYW5maXhlZC1ydW4taWQ']


async def test_a_run_stored_under_the_older_derived_id_is_still_found(store: StepStore) -> None:
    older = dotted_run_id(derive_run_id('librarian', 'ctx-1'))
    assert older == 'bGlicmFyaWFu.Y3R4LTE'
    # What stepcore 0.1 stored for agent_name='librarian' and context run id 'ctx-1'.
    await Agent(TestModel(), capabilities=[StepPersistence(store=store, run_id=older, agent_name='librarian')]).run(
        'hi'
    )
    assert len(await continue_run(store, run_id=older)) == 2
    with pytest.raises(LookupError, match=f"no continuable snapshot for run_id 'sp-.*pass run_id='{older}'"):
        await continue_run(store, run_id=derive_run_id('librarian', 'ctx-1'))


# --- error phrases callers match on --------------------------------------------------------------


async def test_continue_run_says_no_continuable_snapshot(store: StepStore) -> None:
    with pytest.raises(LookupError, match="no continuable snapshot for run_id 'missing'"):
        await continue_run(store, run_id='missing')
    with pytest.raises(LookupError, match="no continuable snapshot for run_id 'missing'"):
        await fork_run(store, run_id='missing', include_interrupted=True)


async def test_an_unsafe_run_id_is_an_invalid_run_id(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path / 'runs')
    agent = Agent(TestModel(), capabilities=[StepPersistence(store=store, run_id='../escape')])
    with pytest.raises(ValueError, match=re.escape("invalid run_id: '../escape'")):
        await agent.run('hi')
    assert not (tmp_path / 'escape').exists()
