"""`delete_run`: a run's record, events, snapshots and ledger go; nothing else does."""

from __future__ import annotations

from typing import Any

from stepcore import RunRecord, StepStore, ToolEffectStatus, inspect_recovery
from stepcore.backend import PERSISTENT

from ._support import (
    StoreFixtures,
    at,
    canonical,
    conversation,
    event,
    needs_feature,
    new_id,
    register,
    snapshot,
    tool_exchange,
)
from .effects import effect
from .persistence import second_store

__all__ = ('DeleteConformance',)


async def _fill(store: StepStore, run_id: str, *, tag: str, conversation_id: str | None = None) -> None:
    """Register `run_id` and give it events, a ledger and snapshots, keyed as a run keys them."""
    await register(store, run_id, conversation_id=conversation_id, registration_id=f'reg-{tag}')
    for n in range(3):
        await store.append_event(event(run_id, n, idempotency_key=f'event-{n}', metadata={'tag': tag}))
    await store.record_tool_effect(effect(run_id, 'c1', ToolEffectStatus.COMPLETED, started=1))
    await store.record_tool_effect(effect(run_id, 'c2', started=2))
    for step in range(1, 3):
        await store.save_snapshot(
            snapshot(run_id, conversation(step, tag=tag), step_index=step, idempotency_key=f'snapshot-{step}')
        )


async def _state(store: StepStore, run_id: str) -> tuple[Any, ...]:
    return (
        await store.get_run(run_id=run_id),
        await store.list_events(run_id=run_id),
        await store.list_tool_effects(run_id=run_id),
        await store.list_snapshots(run_id=run_id, include_interrupted=True),
    )


async def _check_gone(store: StepStore, run_id: str) -> None:
    assert await store.get_run(run_id=run_id) is None, f'the run record of {run_id!r} outlived delete_run'
    assert run_id not in [r.run_id for r in await store.list_runs()]
    assert await store.list_events(run_id=run_id) == [], f'events of {run_id!r} outlived delete_run'
    assert await store.list_snapshots(run_id=run_id, include_interrupted=True) == [], (
        f'snapshots of {run_id!r} outlived delete_run'
    )
    assert await store.latest_snapshot(run_id=run_id, include_interrupted=True) is None
    assert await store.list_tool_effects(run_id=run_id) == [], f'ledger entries of {run_id!r} outlived delete_run'
    assert await store.list_unresolved_tool_effects(run_id=run_id) == []
    assert await store.get_tool_effect(run_id=run_id, tool_call_id='c1') is None


class DeleteConformance(StoreFixtures):
    """`delete_run` removes one run whole, answers whether there was one, and frees its id."""

    async def test_delete_removes_the_run_and_nothing_else(self, store: StepStore) -> None:
        conversation_id = new_id('conv')
        doomed, kept = new_id('doomed'), new_id('kept')
        await _fill(store, doomed, tag='doomed', conversation_id=conversation_id)
        await _fill(store, kept, tag='kept', conversation_id=conversation_id)
        before = await _state(store, kept)
        assert await store.delete_run(doomed) is True
        await _check_gone(store, doomed)
        assert (await inspect_recovery(store=store, run_id=doomed)).run is None
        assert await _state(store, kept) == before, 'delete_run changed another run'
        assert [r.run_id for r in await store.list_runs(conversation_id=conversation_id)] == [kept]

    async def test_delete_of_an_unknown_run_is_false(self, store: StepStore) -> None:
        assert await store.delete_run(new_id('never-registered')) is False
        run_id = await register(store)
        assert await store.delete_run(run_id) is True
        assert await store.delete_run(run_id) is False, 'a second delete_run of the same run must answer False'

    async def test_a_deleted_run_id_can_be_used_again(self, store: StepStore) -> None:
        run_id = new_id('reused')
        await _fill(store, run_id, tag='first')
        assert await store.delete_run(run_id) is True
        # A new registration (another registration_id), and the keys of the deleted run apply again.
        await _fill(store, run_id, tag='second')
        record = await store.get_run(run_id=run_id)
        assert record is not None
        assert record.registration_id == 'reg-second'
        events = await store.list_events(run_id=run_id)
        assert [(e.step_index, e.metadata['tag']) for e in events] == [(n, 'second') for n in range(3)]
        assert [s.messages for s in await store.list_snapshots(run_id=run_id)] == [
            canonical(conversation(step, tag='second')) for step in range(1, 3)
        ]
        assert [e.tool_call_id for e in await store.list_unresolved_tool_effects(run_id=run_id)] == ['c2']
        # A history written before the delete is not a base for the new run's snapshots.
        longer = [*conversation(2, tag='second'), *conversation(1, tag='third')]
        await store.save_snapshot(snapshot(run_id, longer, step_index=3))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == canonical(longer)

    @needs_feature(PERSISTENT)
    async def test_another_store_no_longer_sees_a_deleted_run(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        run_id = new_id('shared')
        await _fill(store, run_id, tag='first')
        async with second_store(store_spec) as other:
            assert await other.get_run(run_id) is not None
            # The other store writes to the run too, so it holds the run's history in memory.
            await other.save_snapshot(snapshot(run_id, conversation(3, tag='first'), step_index=3))
            assert await store.delete_run(run_id) is True
            await _check_gone(other, run_id)
            # It can register the id again and write a history of its own, stored whole.
            await other.register_run(RunRecord(run_id=run_id, started_at=at(5)))
            again = [*conversation(3, tag='first'), *conversation(1, tag='after')]
            await other.save_snapshot(snapshot(run_id, again, step_index=4))
            for reader in (store, other):
                assert [s.messages for s in await reader.list_snapshots(run_id)] == [canonical(again)]

    @needs_feature(PERSISTENT)
    async def test_a_store_remembering_a_deleted_run_does_not_build_on_its_successor(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        run_id = new_id('recreated')
        async with second_store(store_spec) as other:
            first = conversation(6, tag='first')
            await other.save_snapshot(snapshot(run_id, first, step_index=1))  # `other` remembers these messages
            assert await store.delete_run(run_id) is True
            # The run id is used again, with as many messages: a store that handed out the deleted
            # run's message ids again would let `other` take them for its own.
            await store.save_snapshot(snapshot(run_id, conversation(6, tag='second'), step_index=1))
            longer = [*first, *tool_exchange(7)]
            await other.save_snapshot(snapshot(run_id, longer, step_index=2))
            latest = await store.latest_snapshot(run_id=run_id)
            assert latest is not None
            assert latest.messages == canonical(longer), (
                "a save by a store that remembered the deleted run was chained onto the new run's messages: "
                'message node ids must never be handed out again for a run id, even after delete_run'
            )
