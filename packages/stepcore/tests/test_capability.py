"""StepPersistence behaviour that does not depend on the backend (run with the in-memory store)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.test import TestModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.usage import RunUsage

from stepcore import (
    InMemoryStepStore,
    RunRecord,
    SnapshotSaved,
    SnapshotState,
    StepPersistence,
    ToolEffectStatus,
    continue_run,
    fork_run,
    from_spec,
    inspect_recovery,
    is_provider_valid,
)
from stepcore.plugins.registry import get_registry
from stepcore.store.ids import derive_run_id
from stepcore_conformance.capability import function_model


def _text(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])


def _calls(*call_ids: str) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool_name='t', args={}, tool_call_id=i) for i in call_ids])


def _returns(*call_ids: str) -> ModelRequest:
    return ModelRequest(parts=[ToolReturnPart(tool_name='t', content='ok', tool_call_id=i) for i in call_ids])


PROMPT = ModelRequest(parts=[UserPromptPart('hi')])


# --- is_provider_valid ---------------------------------------------------------------------------


def test_is_provider_valid_matches_calls_to_results() -> None:
    assert is_provider_valid([])
    assert is_provider_valid([PROMPT, _text('hello')])
    assert is_provider_valid([PROMPT, _calls('a', 'b'), _returns('a', 'b')])
    assert not is_provider_valid([PROMPT, _calls('a', 'b'), _returns('a')])
    assert not is_provider_valid([PROMPT, _calls('a')])
    assert not is_provider_valid([PROMPT, _calls('a'), _returns('a'), _calls('b')])


# --- construction --------------------------------------------------------------------------------


def test_stable_id_and_defaults() -> None:
    capability = StepPersistence[None]()
    assert capability.id == 'step_persistence'
    assert isinstance(capability.store, InMemoryStepStore)
    assert (capability.agent_name, capability.run_id, capability.parent_run_id) == (None, None, None)
    assert capability.metadata == {}
    assert capability.capture_frontier is False
    assert capability.compaction_transcript_handle() is None
    assert SnapshotSaved(persistence_run_id='r').kind == 'step_persistence.snapshot_saved'


def test_metadata_must_be_strings() -> None:
    bad: Any = {'team': 3}
    with pytest.raises(ValueError, match=r"'team': 3 .*str\(\)"):
        StepPersistence(metadata=bad)
    assert StepPersistence(metadata={'team': 'search'}).metadata == {'team': 'search'}


def test_from_spec_builds_the_store_through_the_registry() -> None:
    capability = StepPersistence.from_spec(max_snapshots_per_run=3, agent_name='lib', capture_frontier=True)
    assert isinstance(capability.store, InMemoryStepStore)
    assert capability.store.max_snapshots_per_run == 3
    assert (capability.agent_name, capability.capture_frontier) == ('lib', True)
    with pytest.raises(ValueError, match="'nosuch'"):
        StepPersistence.from_spec('nosuch')
    with pytest.raises(ValueError, match=r"installed backends: .*'memory'"):
        StepPersistence.from_spec(backend='memroy')


async def test_agent_from_spec_uses_step_persistence() -> None:
    agent = Agent.from_spec(
        {'model': 'test', 'capabilities': [{'StepPersistence': {'backend': 'memory', 'agent_name': 'spec_agent'}}]},
        custom_capability_types=[StepPersistence],
    )
    found: list[Any] = []
    agent.root_capability.apply(found.append)
    [capability] = [cast(StepPersistence[Any], c) for c in found if isinstance(c, StepPersistence)]
    result = await agent.run('hello')
    run_id = derive_run_id('spec_agent', result.run_id)
    assert (await capability.store.get_run(run_id)) is not None


# --- identity ------------------------------------------------------------------------------------


async def test_agent_name_derives_the_run_id_and_falls_back_on_records() -> None:
    store = InMemoryStepStore()
    named = Agent(TestModel(), capabilities=[StepPersistence(store=store, agent_name='librarian')])
    result = await named.run('hi')
    record = await store.get_run(derive_run_id('librarian', result.run_id))
    assert record is not None
    assert record.agent_name == 'librarian'

    unnamed = Agent(TestModel(), name='fallback_name', capabilities=[StepPersistence(store=store)])
    result = await unnamed.run('hi')
    record = await store.get_run(result.run_id)  # the store key stays ctx.run_id
    assert record is not None
    assert record.agent_name == 'fallback_name'


async def test_derived_run_id_over_200_characters_fails_before_the_store_is_touched() -> None:
    store = InMemoryStepStore()
    agent = Agent(TestModel(), capabilities=[StepPersistence(store=store, agent_name='x' * 200)])
    with pytest.raises(ValueError, match='200'):
        await agent.run('hi')
    assert await store.list_runs() == []


async def test_missing_context_run_id_is_a_runtime_error() -> None:
    capability = StepPersistence[None]()
    ctx = RunContext[Any](deps=None, model=TestModel(), usage=RunUsage(), run_id=None)
    with pytest.raises(RuntimeError, match='run id'):
        await capability.for_run(ctx)
    explicit = await StepPersistence[None](run_id='given').for_run(ctx)
    assert explicit.compaction_transcript_handle() == 'given'
    assert explicit.id == 'step_persistence'


async def test_compaction_transcript_handle_is_the_run_id_during_the_run() -> None:
    store = InMemoryStepStore()
    handles: list[str | None] = []
    agent = Agent(
        function_model(lambda messages, info: _calls('h1') if len(messages) == 1 else _text('done')),
        capabilities=[StepPersistence(store=store, agent_name='compactor')],
    )

    @agent.tool
    def t(ctx: RunContext[Any]) -> str:  # pyright: ignore[reportUnusedFunction]
        handles.extend(
            c.compaction_transcript_handle() for c in ctx.capabilities.values() if isinstance(c, StepPersistence)
        )
        return 'ok'

    result = await agent.run('go')
    assert handles == [derive_run_id('compactor', result.run_id)]


# --- tool ledger details -------------------------------------------------------------------------


async def test_model_retry_from_a_tool_is_a_failed_effect() -> None:
    store = InMemoryStepStore()
    replies = iter([_calls('r1'), _calls('r2'), _text('done')])
    agent = Agent(
        function_model(lambda messages, info: next(replies)),
        capabilities=[StepPersistence(store=store, run_id='retry')],
    )
    attempts: list[int] = []

    @agent.tool_plain
    def t() -> str:  # pyright: ignore[reportUnusedFunction]
        attempts.append(1)
        if len(attempts) == 1:
            raise ModelRetry('try again')
        return 'ok'

    await agent.run('go')
    effects = {e.tool_call_id: e for e in await store.list_tool_effects('retry')}
    assert effects['r1'].status is ToolEffectStatus.FAILED
    assert effects['r1'].error is not None
    assert 'try again' in effects['r1'].error
    assert effects['r2'].status is ToolEffectStatus.COMPLETED
    # The retried call is answered in history, so the boundary is complete.
    first = (await store.list_snapshots('retry', include_interrupted=True))[0]
    assert first.state is SnapshotState.COMPLETE


async def test_saved_snapshots_are_isolated_from_later_mutation() -> None:
    store = InMemoryStepStore()
    agent = Agent(
        function_model(lambda messages, info: _text('answer')),
        capabilities=[StepPersistence(store=store, run_id='iso')],
    )
    result = await agent.run('question')
    messages: list[ModelMessage] = result.all_messages()
    response = messages[-1]
    assert isinstance(response, ModelResponse)
    cast(list[Any], response.parts)[0] = TextPart('mutated')
    history = await continue_run(store, run_id='iso')
    assert history[-1].parts[0] == TextPart('answer')
    assert await fork_run(store, run_id='iso') == history


async def test_inspect_recovery_of_an_unknown_run_is_empty() -> None:
    report = await inspect_recovery(store=InMemoryStepStore(), run_id='nope')
    assert report.run is None
    assert report.newest_snapshot is None
    assert report.settled_snapshot is None
    assert report.unresolved_effects == []
    assert not report.interrupted


async def test_retried_registration_is_idempotent_and_distinct_reuse_fails() -> None:
    store = InMemoryStepStore()
    ctx = RunContext[Any](deps=None, model=TestModel(), usage=RunUsage(), run_id='ctx-run')
    capability = await StepPersistence[Any](store=store).for_run(ctx)
    identity = await capability._op_registration_identity(ctx)  # pyright: ignore[reportPrivateUsage]
    record = RunRecord(run_id='ctx-run', started_at=identity.started_at, registration_id=identity.registration_id)
    await capability._op_register_run(ctx, record)  # pyright: ignore[reportPrivateUsage]
    # The same journaled identity again (a durable engine retrying the operation) is accepted.
    await capability._op_register_run(ctx, record)  # pyright: ignore[reportPrivateUsage]
    assert await store.get_run('ctx-run') == record
    other = await capability._op_registration_identity(ctx)  # pyright: ignore[reportPrivateUsage]
    assert other.registration_id != identity.registration_id
    with pytest.raises(ValueError, match='ctx-run'):
        await capability._op_register_run(ctx, record.model_copy(update={'registration_id': other.registration_id}))  # pyright: ignore[reportPrivateUsage]


def test_spec_schema_lists_the_capability_options() -> None:
    from pydantic_ai.agent.spec import AgentSpec

    schema = json.dumps(AgentSpec.model_json_schema_with_capabilities(custom_capability_types=[StepPersistence]))
    for option in ('backend', 'agent_name', 'run_id', 'parent_run_id', 'metadata', 'capture_frontier'):
        assert f'"{option}"' in schema


def _persistence_of(agent: Agent[Any, Any]) -> StepPersistence[Any]:
    found: list[Any] = []
    agent.root_capability.apply(found.append)
    [capability] = [cast(StepPersistence[Any], c) for c in found if isinstance(c, StepPersistence)]
    return capability


async def test_agent_from_spec_passes_every_other_option_to_the_store(tmp_path: Path) -> None:
    options = {'backend': 'memory', 'agent_name': 'spec_agent', 'capture_frontier': True, 'max_snapshots_per_run': 1}
    agent = Agent.from_spec(
        {'model': 'test', 'capabilities': [{'StepPersistence': options}]}, custom_capability_types=[StepPersistence]
    )
    capability = _persistence_of(agent)
    assert (capability.agent_name, capability.capture_frontier) == ('spec_agent', True)
    result = await agent.run('hi')
    # the store prunes to one snapshot: the option reached it
    assert (
        len(await capability.store.list_snapshots(derive_run_id('spec_agent', result.run_id), include_interrupted=True))
        == 1
    )

    with pytest.raises(ValueError, match='colour'):
        Agent.from_spec(
            {'model': 'test', 'capabilities': [{'StepPersistence': {'backend': 'memory', 'colour': 'blue'}}]},
            custom_capability_types=[StepPersistence],
        )

    if 'sqlite' not in get_registry().keys('step'):
        return
    spec = {'backend': 'sqlite', 'database': str(tmp_path / 'spec.db'), 'synchronous': 'FULL', 'run_id': 'from-spec'}
    agent = Agent.from_spec(
        {'model': 'test', 'capabilities': [{'StepPersistence': spec}]}, custom_capability_types=[StepPersistence]
    )
    store = _persistence_of(agent).store
    try:
        await agent.run('hi')
    finally:
        await store.aclose()
    reopened = from_spec('sqlite', database=str(tmp_path / 'spec.db'))
    try:
        assert (await reopened.get_run('from-spec')) is not None
    finally:
        await reopened.aclose()


# --- ordering ------------------------------------------------------------------------------------


class _RewriteFinalHistory(AbstractCapability[Any]):
    """Rewrites the final answer in `after_run`, as a compaction capability might."""

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        response = result.all_messages()[-1]
        assert isinstance(response, ModelResponse)
        cast(list[Any], response.parts)[0] = TextPart('rewritten')
        return result


def test_step_persistence_keeps_its_place_in_the_list_unless_asked_for_the_outside() -> None:
    assert StepPersistence[None]().get_ordering() is None
    ordering = StepPersistence[None](outermost=True).get_ordering()
    assert ordering is not None
    assert ordering.position == 'outermost'


async def test_the_final_snapshot_holds_a_rewrite_made_by_a_capability_listed_after_it() -> None:
    store = InMemoryStepStore()
    agent = Agent(
        function_model(lambda messages, info: _text('original')),
        capabilities=[StepPersistence(store=store, run_id='rewritten'), _RewriteFinalHistory()],
    )
    await agent.run('go')
    history = await continue_run(store, run_id='rewritten')
    assert history[-1].parts[0] == TextPart('rewritten')


@pytest.mark.parametrize(('outermost', 'saved'), [(False, 'original'), (True, 'rewritten')])
async def test_a_rewrite_by_a_capability_listed_before_it_is_saved_only_when_outermost(
    outermost: bool, saved: str
) -> None:
    """As in the reference, after hooks run in reverse list order: a capability listed before the
    recorder rewrites the history after the recorder saved it, unless the recorder is outermost."""
    store = InMemoryStepStore()
    agent = Agent(
        function_model(lambda messages, info: _text('original')),
        capabilities=[_RewriteFinalHistory(), StepPersistence(store=store, run_id='listed', outermost=outermost)],
    )
    await agent.run('go')
    history = await continue_run(store, run_id='listed')
    assert history[-1].parts[0] == TextPart(saved)
