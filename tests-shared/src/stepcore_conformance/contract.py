"""The contract section: the store reached the way users of the reference reach theirs.

`StepPersistence` needs only the reference's protocol (`stepcore.StepStoreProtocol`). These tests
drive a real `Agent` through two stand-ins built around the backend's store, and then read the
store itself:

- a **protocol-only store**: a class with just the contract's ten methods, no base class,
  forwarding to the store (a user's own store written to the reference);
- a **`__getattr__` wrapper**: a class that overrides the three writes (to count, or to trim, as a
  library built on the reference does) and forwards every other attribute to the store.

The wrapper's overrides must see every write the run makes, and what the run stored must read
back through the store as through any other path: the crash rule holds on the per-record path too
(a call is `completed` only once a complete snapshot holding its result was saved).
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolReturnPart

from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    StepPersistence,
    StepStore,
    StepStoreProtocol,
    ToolEffectRecord,
    ToolEffectStatus,
    continue_run,
    inspect_recovery,
)
from stepcore.backend import ProtocolStore, as_step_store

from ._support import StoreFixtures, new_id
from .capability import function_model, script, tool_call

__all__ = ('ContractConformance', 'ForwardingWrapper', 'ProtocolOnlyStore')


class ProtocolOnlyStore:
    """A store with the reference's ten methods and nothing else, kept in another store."""

    def __init__(self, store: StepStore) -> None:
        self._store = store

    async def register_run(self, record: RunRecord) -> None:
        await self._store.register_run(record)

    async def get_run(self, *, run_id: str) -> RunRecord | None:
        return await self._store.get_run(run_id=run_id)

    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]:
        return await self._store.list_runs(parent_run_id=parent_run_id, conversation_id=conversation_id)

    async def append_event(self, event: StepEvent) -> None:
        await self._store.append_event(event)

    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        return await self._store.list_events(run_id=run_id)

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._store.save_snapshot(snapshot)

    async def latest_snapshot(self, *, run_id: str, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        return await self._store.latest_snapshot(run_id=run_id, include_interrupted=include_interrupted)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._store.record_tool_effect(record)

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        return await self._store.get_tool_effect(run_id=run_id, tool_call_id=tool_call_id)

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        return await self._store.list_unresolved_tool_effects(run_id=run_id)


class ForwardingWrapper:
    """Overrides the three writes, noting each in `writes` in order, and forwards everything else."""

    def __init__(self, store: StepStore) -> None:
        self._store = store
        self.writes: list[tuple[str, Any]] = []

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        self.writes.append(('snapshot', snapshot))
        await self._store.save_snapshot(snapshot)

    async def append_event(self, event: StepEvent) -> None:
        self.writes.append(('event', event))
        await self._store.append_event(event)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        self.writes.append(('effect', record))
        await self._store.record_tool_effect(record)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def of(self, kind: str) -> list[Any]:
        return [record for what, record in self.writes if what == kind]


def _agent(store: object, run_id: str) -> Agent[Any, str]:
    """An agent that calls `lookup` twice (one cycle each), then answers."""
    respond = script(
        ModelResponse(parts=[tool_call('lookup', 'call-1', q='a')]),
        ModelResponse(parts=[tool_call('lookup', 'call-2', q='b')]),
        ModelResponse(parts=[TextPart('done')]),
    )
    persistence = StepPersistence[Any](store=cast(StepStoreProtocol, store), run_id=run_id)
    agent = Agent(function_model(respond), capabilities=[persistence])

    @agent.tool_plain
    def lookup(q: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'{q} found'

    return agent


def _answered(snapshot: ContinuableSnapshot) -> set[str]:
    found: set[str] = set()
    for message in snapshot.messages:
        if isinstance(message, ModelRequest):
            found.update(p.tool_call_id for p in message.parts if isinstance(p, ToolReturnPart))
    return found


class ContractConformance(StoreFixtures):
    """The store behind a protocol-only class and behind a `__getattr__` wrapper."""

    async def test_a_protocol_only_store_runs_an_agent(self, store: StepStore) -> None:
        facade = ProtocolOnlyStore(store)
        assert isinstance(facade, StepStore), 'a class with the contract methods counts as a StepStore'
        assert isinstance(as_step_store(facade), ProtocolStore)
        run_id = new_id('protocol')
        result = await _agent(facade, run_id).run('look up a and b', conversation_id=f'{run_id}-conv')

        assert [r.run_id for r in await facade.list_runs(conversation_id=f'{run_id}-conv')] == [run_id]
        history = await continue_run(facade, run_id=run_id)
        assert history == result.all_messages()
        assert await continue_run(store, run_id=run_id) == history
        effects = [await facade.get_tool_effect(run_id=run_id, tool_call_id=c) for c in ('call-1', 'call-2')]
        assert [e.status if e else None for e in effects] == [ToolEffectStatus.COMPLETED] * 2
        assert await facade.list_unresolved_tool_effects(run_id=run_id) == []
        kinds = [e.kind for e in await facade.list_events(run_id=run_id)]
        assert kinds[0] is EventKind.RUN_STARTED
        assert kinds[-1] is EventKind.RUN_COMPLETED
        assert kinds.count(EventKind.TOOL_CALL_COMPLETED) == 2
        report = await inspect_recovery(store=facade, run_id=run_id)
        assert report.unresolved == ()
        assert report.completed_tools == ('lookup',)

    async def test_a_second_run_under_the_same_explicit_id_is_refused_through_the_protocol(
        self, store: StepStore
    ) -> None:
        facade = ProtocolOnlyStore(store)
        run_id = new_id('protocol')
        agent = _agent(facade, run_id)
        await agent.run('first')
        with pytest.raises(ValueError, match=run_id):
            await agent.run('second')

    async def test_a_wrappers_overrides_see_every_write(self, store: StepStore) -> None:
        wrapper = ForwardingWrapper(store)
        assert isinstance(as_step_store(wrapper), ProtocolStore), 'a wrapper is reached through its own methods'
        run_id = new_id('wrapped')
        result = await _agent(wrapper, run_id).run('look up a and b')

        stored_events = await store.list_events(run_id=run_id)
        assert [(e.kind, e.idempotency_key) for e in wrapper.of('event')] == [
            (e.kind, e.idempotency_key) for e in stored_events
        ], 'every event the store holds went through the wrapper, in order'
        snapshots: list[ContinuableSnapshot] = wrapper.of('snapshot')
        assert snapshots, 'the snapshots went through the wrapper'
        assert snapshots[-1].messages == result.all_messages()
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == result.all_messages()
        final = {e.tool_call_id: e for e in wrapper.of('effect')}
        assert {c: e.status for c, e in final.items()} == {
            'call-1': ToolEffectStatus.COMPLETED,
            'call-2': ToolEffectStatus.COMPLETED,
        }
        for call_id in ('call-1', 'call-2'):
            stored = await store.get_tool_effect(run_id=run_id, tool_call_id=call_id)
            assert stored is not None
            assert stored.status is ToolEffectStatus.COMPLETED

    async def test_the_crash_rule_holds_on_the_per_record_path(self, store: StepStore) -> None:
        wrapper = ForwardingWrapper(store)
        run_id = new_id('order')
        await _agent(wrapper, run_id).run('look up a and b')
        saved: list[ContinuableSnapshot] = []
        for what, record in wrapper.writes:
            if what == 'snapshot':
                saved.append(record)
            elif what == 'effect' and record.status is ToolEffectStatus.COMPLETED:
                holding = [
                    s for s in saved if s.state is SnapshotState.COMPLETE and record.tool_call_id in _answered(s)
                ]
                assert holding, f'{record.tool_call_id} was recorded completed before a snapshot held its result'
            elif what == 'effect':
                assert record.status is ToolEffectStatus.STARTED

    async def test_a_wrapper_that_trims_snapshots_keeps_what_it_saved(self, store: StepStore) -> None:
        """A library built on the reference saves each turn's new messages only, and joins turns itself."""

        class TurnOnly(ForwardingWrapper):
            given: list[ModelMessage]

            async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
                trimmed = snapshot.messages[len(self.given) :]
                await super().save_snapshot(dataclasses.replace(snapshot, messages=trimmed))

        wrapper = TurnOnly(store)
        run_id = new_id('trimmed')
        first = await _agent(store, f'{run_id}-first').run('first turn')
        wrapper.given = first.all_messages()
        second = await _agent(wrapper, run_id).run('second turn', message_history=wrapper.given)
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == second.new_messages(), 'the wrapper decides what a snapshot holds'
