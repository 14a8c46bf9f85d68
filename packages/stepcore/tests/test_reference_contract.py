"""The reference's contract, as its users rely on it: record shapes, `dataclasses.replace`, stores
written to its protocol (no base class), wrappers, list order and hooks called without `for_run`.

The field lists below were read off pydantic-ai-harness 0.62.0's records.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from stepcore import (
    ContinuableSnapshot,
    InMemoryStepStore,
    RunRecord,
    StepEvent,
    StepPersistence,
    StepStore,
    StepStoreProtocol,
    ToolEffectRecord,
    continue_run,
)
from stepcore.store.contract import ProtocolStore, as_step_store, own_extension
from stepcore_conformance.contract import ForwardingWrapper, ProtocolOnlyStore

REFERENCE_FIELDS: dict[type, list[tuple[str, bool]]] = {
    # (name, has a default) in the reference's declaration order
    RunRecord: [
        ('run_id', False),
        ('conversation_id', True),
        ('parent_run_id', True),
        ('agent_name', True),
        ('metadata', True),
        ('started_at', True),
        ('registration_id', True),
    ],
    StepEvent: [
        ('run_id', False),
        ('kind', False),
        ('step_index', False),
        ('timestamp', True),
        ('conversation_id', True),
        ('parent_run_id', True),
        ('agent_name', True),
        ('tool_call_id', True),
        ('tool_name', True),
        ('error', True),
        ('metadata', True),
        ('idempotency_key', True),
    ],
    ContinuableSnapshot: [
        ('run_id', False),
        ('step_index', False),
        ('messages', False),
        ('conversation_id', True),
        ('parent_run_id', True),
        ('agent_name', True),
        ('timestamp', True),
        ('state', True),
        ('idempotency_key', True),
    ],
    ToolEffectRecord: [
        ('tool_call_id', False),
        ('tool_name', False),
        ('run_id', False),
        ('status', False),
        ('started_at', True),
        ('ended_at', True),
        ('idempotency_key', True),
        ('effect_summary', True),
    ],
}


def _has_default(field: dataclasses.Field[Any]) -> bool:
    return field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING


@pytest.mark.parametrize('cls', list(REFERENCE_FIELDS), ids=lambda c: c.__name__)
def test_records_are_keyword_only_dataclasses_with_the_reference_fields_first(cls: type) -> None:
    fields = dataclasses.fields(cls)
    expected = REFERENCE_FIELDS[cls]
    assert [(f.name, _has_default(f)) for f in fields[: len(expected)]] == expected
    assert all(f.kw_only for f in fields)
    assert all(_has_default(f) for f in fields[len(expected) :]), 'stepcore additions must be optional'


def _records() -> list[Any]:
    return [
        RunRecord(run_id='r'),
        StepEvent(run_id='r', kind='run_started', step_index=0),
        ContinuableSnapshot(run_id='r', step_index=1, messages=[]),
        ToolEffectRecord(tool_call_id='c', tool_name='t', run_id='r', status='started'),
    ]


@pytest.mark.parametrize('record', _records(), ids=lambda r: type(r).__name__)
def test_replace_and_equality_work_on_every_record(record: Any) -> None:
    copy = dataclasses.replace(record, run_id='other')
    assert type(copy) is type(record)
    assert copy.run_id == 'other'
    assert copy != record
    assert dataclasses.replace(copy, run_id='r') == record


def test_replace_still_validates() -> None:
    snapshot = ContinuableSnapshot(run_id='r', step_index=1, messages=[])
    with pytest.raises(ValueError, match='state'):
        dataclasses.replace(snapshot, state='half-done')


def test_records_refuse_positional_arguments() -> None:
    with pytest.raises((TypeError, ValueError), match='positional'):
        RunRecord('r')  # type: ignore[misc]


# --- stores written to the protocol ----------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class _ForeignSnapshot:
    """A snapshot of another library's record type, with the reference's fields."""

    run_id: str
    step_index: int
    messages: list[Any]
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    timestamp: Any = None
    state: str = 'complete'
    idempotency_key: str | None = None


class _ForeignRecordsStore(ProtocolOnlyStore):
    """A protocol-only store that returns its own dataclasses rather than stepcore's."""

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> Any:
        found = await super().latest_snapshot(run_id=run_id, include_interrupted=include_interrupted)
        if found is None:
            return None
        return _ForeignSnapshot(**{f.name: getattr(found, f.name) for f in dataclasses.fields(_ForeignSnapshot)})


async def _readme_example(store: Any) -> tuple[str, int]:
    agent = Agent(TestModel(), capabilities=[StepPersistence(store=store, agent_name='librarian')])
    result = await agent.run('Find the definition', conversation_id='conv-1')
    run_id = (await store.list_runs(conversation_id='conv-1'))[-1].run_id
    history = await continue_run(store, run_id=run_id)
    follow_up = await agent.run('And now the follow-up', message_history=history, conversation_id='conv-1')
    assert follow_up.output
    return result.output, len(history)


async def _every_snapshot(store: StepStore) -> list[ContinuableSnapshot]:
    return [s for r in await store.list_runs() for s in await store.list_snapshots(r.run_id, include_interrupted=True)]


@pytest.mark.parametrize('kind', ['protocol-only', 'foreign records', '__getattr__ wrapper'])
async def test_the_readme_example_runs_on_a_store_without_the_base_class(kind: str) -> None:
    inner = InMemoryStepStore()
    store: Any = {
        'protocol-only': ProtocolOnlyStore,
        'foreign records': _ForeignRecordsStore,
        '__getattr__ wrapper': ForwardingWrapper,
    }[kind](inner)
    assert isinstance(store, StepStoreProtocol)
    output, messages = await _readme_example(store)
    assert output
    assert messages >= 2
    runs = await inner.list_runs(conversation_id='conv-1')
    assert len(runs) == 2
    for run in runs:
        assert await inner.latest_snapshot(run_id=run.run_id) is not None


async def test_a_wrapper_sees_every_snapshot_of_the_readme_example() -> None:
    inner = InMemoryStepStore()
    wrapper = ForwardingWrapper(inner)
    await _readme_example(wrapper)
    stored = await _every_snapshot(inner)
    assert stored
    assert len(wrapper.of('snapshot')) == len(stored)


class _CountingSubclass(InMemoryStepStore):
    """A subclass of a store that defines `write_batch`, overriding only `save_snapshot`."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: list[int] = []

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        self.saved.append(snapshot.step_index)
        await super().save_snapshot(snapshot)


async def test_a_subclass_overriding_save_snapshot_sees_every_snapshot() -> None:
    store = _CountingSubclass()
    assert not own_extension(store, 'write_batch')
    await _readme_example(store)
    stored = await _every_snapshot(store)
    assert len(store.saved) == len(stored) > 0


def test_own_extension_is_the_class_s_own_and_never_found_through_getattr() -> None:
    plain = InMemoryStepStore()
    assert own_extension(plain, 'write_batch')
    wrapper = ForwardingWrapper(plain)
    assert callable(wrapper.write_batch)  # reachable through __getattr__ ...
    assert not own_extension(wrapper, 'write_batch')  # ... and still not used
    assert not own_extension(ProtocolOnlyStore(plain), 'list_events_page')


def test_as_step_store_wraps_only_what_is_not_a_step_store() -> None:
    plain = InMemoryStepStore()
    assert as_step_store(plain) is plain
    wrapped = as_step_store(ProtocolOnlyStore(plain))
    assert isinstance(wrapped, ProtocolStore)
    assert isinstance(wrapped, StepStore)


def test_a_non_store_is_refused_at_construction_naming_what_it_lacks() -> None:
    class Half:
        async def register_run(self, record: RunRecord) -> None: ...

    with pytest.raises(TypeError, match=r'Half cannot be used as a step store: it has no get_run, list_runs'):
        StepPersistence(store=Half())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match='str'):
        StepPersistence(store='runs.db')  # type: ignore[arg-type]


# --- list order -----------------------------------------------------------------------------------


class _Refuse(AbstractCapability[Any]):
    async def before_run(self, ctx: RunContext[Any]) -> None:
        raise PermissionError('not today')


async def test_a_capability_before_the_recorder_that_refuses_the_run_leaves_nothing_stored() -> None:
    store = InMemoryStepStore()
    agent = Agent(TestModel(), capabilities=[_Refuse(), StepPersistence(store=store, agent_name='a')])
    with pytest.raises(PermissionError, match='not today'):
        await agent.run('hi')
    assert await store.list_runs() == []


async def test_a_capability_after_the_recorder_that_refuses_the_run_finds_it_registered() -> None:
    store = InMemoryStepStore()
    agent = Agent(TestModel(), capabilities=[StepPersistence(store=store, agent_name='a'), _Refuse()])
    with pytest.raises(PermissionError, match='not today'):
        await agent.run('hi')
    assert len(await store.list_runs()) == 1


# --- hooks called directly, without for_run ---------------------------------------------------------


class _Down(ProtocolOnlyStore):
    async def register_run(self, record: RunRecord) -> None:
        raise ConnectionError('database is down (503)')


async def test_an_unbound_hook_surfaces_the_store_s_own_exception() -> None:
    persistence = StepPersistence(store=_Down(InMemoryStepStore()))
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage(), run_id='run-1')
    with pytest.raises(ConnectionError, match='503'):
        await persistence.before_run(ctx)


async def test_an_unbound_hook_without_a_run_id_names_the_agent_graph() -> None:
    persistence = StepPersistence(store=InMemoryStepStore())
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    with pytest.raises(RuntimeError, match='agent graph'):
        await persistence.before_run(ctx)


@pytest.mark.parametrize('wrap', [ProtocolOnlyStore, ForwardingWrapper], ids=['protocol-only', 'getattr-wrapper'])
async def test_a_store_without_leases_works_as_before_and_recovery_says_ownership_is_unchecked(wrap: Any) -> None:
    import asyncio
    import io

    from rich.console import Console

    from stepcore import inspect_recovery, list_orphans, resolve_run
    from stepcore.cli.recovery_view import describe_recovery
    from stepcore_conformance.subclass import _notes_agent  # pyright: ignore[reportPrivateUsage]

    store = wrap(InMemoryStepStore())
    writes: list[str] = []
    began = asyncio.Event()
    cut = asyncio.create_task(_notes_agent(store, writes, block=began, run_id='plain-1').run('note'))
    await asyncio.wait_for(began.wait(), 30)
    cut.cancel()
    await asyncio.gather(cut, return_exceptions=True)

    report = await inspect_recovery(store=store, run_id='plain-1')
    assert not report.leases_kept
    assert report.lease is None
    console = Console(file=io.StringIO(), width=200)
    console.print(describe_recovery('plain-1', report))
    assert 'This store keeps no leases, so ownership cannot be checked' in console.file.getvalue()  # pyright: ignore[reportAttributeAccessIssue]
    assert await list_orphans(store) == []  # nothing tells who owns a run here
    agent = _notes_agent(store, writes)
    resumption = await resolve_run(store, run_id='plain-1', agent=agent, policies={'write': 'rerun'})
    assert resumption.ownership == 'unchecked'
    assert resumption.claim is None
    assert (await resumption.run(agent)).output == 'noted after 2 write(s)'
    # resumed once: resolving it again follows it to its continuation, which finished
    again = await resolve_run(store, run_id='plain-1', agent=agent)
    assert again.finished
    assert len(again.followed) == 2


@pytest.mark.parametrize('wrap', [ProtocolOnlyStore, ForwardingWrapper], ids=['protocol-only', 'getattr-wrapper'])
async def test_a_paused_run_is_answered_and_resumed_on_a_store_written_to_the_protocol(wrap: Any) -> None:
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.tools import DeferredToolRequests

    from stepcore import AnswerConflictError, approve_call, deny_call, list_waiting, read_waiting, resume_run

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del info
        returned = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f'said: {returned[-1]}')])
        return ModelResponse(parts=[ToolCallPart('drop_table', {'name': 'users'}, tool_call_id='call-drop')])

    store = wrap(InMemoryStepStore())
    ran: list[str] = []
    agent = Agent(
        FunctionModel(respond), output_type=[str, DeferredToolRequests], capabilities=[StepPersistence(store=store)]
    )

    @agent.tool_plain(requires_approval=True)
    def drop_table(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
        ran.append(name)
        return f'dropped {name}'

    run_id = (await agent.run('drop it')).run_id
    assert [w.run_id for w in await list_waiting(store)] == [run_id]
    await approve_call(store, run_id=run_id, tool_call_id='call-drop', override_args={'name': 'guests'}, by='a')
    with pytest.raises(AnswerConflictError):  # the store applies the answer's key once
        await deny_call(store, run_id=run_id, tool_call_id='call-drop')
    result = await resume_run(store, run_id=run_id, agent=agent)
    assert result.output == 'said: dropped guests'
    assert ran == ['guests']
    waiting = await read_waiting(store, run_id=run_id)
    assert waiting is not None
    assert waiting.resumed_by == result.run_id  # told by the resumption's record: the store keeps no leases
    assert await list_waiting(store) == []
