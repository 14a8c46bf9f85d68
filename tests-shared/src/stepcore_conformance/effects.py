"""The tool-effect ledger: upsert per `(run_id, tool_call_id)`, unresolved listing."""

from __future__ import annotations

from typing import Any

from stepcore import StepStore, ToolEffectRecord, ToolEffectStatus

from ._support import StoreFixtures, at, new_id, register

__all__ = ('EffectsConformance',)

STARTED = ToolEffectStatus.STARTED
COMPLETED = ToolEffectStatus.COMPLETED
FAILED = ToolEffectStatus.FAILED


def effect(
    run_id: str, call: str, status: ToolEffectStatus = STARTED, started: float = 0, **fields: Any
) -> ToolEffectRecord:
    fields.setdefault('tool_name', 'send_email')
    fields.setdefault('updated_at', at(started))
    return ToolEffectRecord(run_id=run_id, tool_call_id=call, status=status, started_at=at(started), **fields)


class EffectsConformance(StoreFixtures):
    """`record_tool_effect`, `get_tool_effect`, `list_tool_effects`, `list_unresolved_tool_effects`."""

    async def test_record_and_get_round_trip_every_field(self, store: StepStore) -> None:
        run_id = await register(store)
        record = effect(
            run_id,
            'call-1',
            started=1.5,
            step_index=3,
            idempotency_key='email-42',
            effect_summary='sent the weekly report',
            args={'to': ['a@example.org'], 'subject': 'Report ✓', 'options': {'cc': None, 'n': 2, 'x': 1.25}},
        )
        await store.record_tool_effect(record)
        assert await store.get_tool_effect(run_id=run_id, tool_call_id='call-1') == record
        assert await store.list_tool_effects(run_id=run_id) == [record]

    async def test_reads_of_unknown_entries(self, store: StepStore) -> None:
        run_id = await register(store)
        assert await store.get_tool_effect(run_id=run_id, tool_call_id='never-called') is None
        missing = new_id('missing')
        assert await store.get_tool_effect(run_id=missing, tool_call_id='call') is None
        assert await store.list_tool_effects(run_id=missing) == []
        assert await store.list_unresolved_tool_effects(run_id=missing) == []

    async def test_upsert_latest_write_wins(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.record_tool_effect(effect(run_id, 'call-1', args={'n': 1}))
        done = effect(
            run_id,
            'call-1',
            COMPLETED,
            updated_at=at(9),
            idempotency_key='k',
            effect_summary='done',
            args={'n': 1},
        )
        await store.record_tool_effect(done)
        assert await store.get_tool_effect(run_id=run_id, tool_call_id='call-1') == done
        assert await store.list_tool_effects(run_id=run_id) == [done]
        assert await store.list_unresolved_tool_effects(run_id=run_id) == []
        # The latest write wins even when it moves the status back (a replayed start).
        restarted = effect(run_id, 'call-1', STARTED, updated_at=at(10))
        await store.record_tool_effect(restarted)
        assert await store.get_tool_effect(run_id=run_id, tool_call_id='call-1') == restarted
        assert await store.list_unresolved_tool_effects(run_id=run_id) == [restarted]

    async def test_unresolved_lists_only_started_entries(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.record_tool_effect(effect(run_id, 'started-1', STARTED, started=1))
        await store.record_tool_effect(effect(run_id, 'completed', COMPLETED, started=2))
        await store.record_tool_effect(effect(run_id, 'failed', FAILED, started=3, error="TimeoutError('smtp')"))
        await store.record_tool_effect(effect(run_id, 'started-2', STARTED, started=4))
        unresolved = await store.list_unresolved_tool_effects(run_id=run_id)
        assert [r.tool_call_id for r in unresolved] == ['started-1', 'started-2']
        assert all(r.unresolved for r in unresolved)
        failed = await store.get_tool_effect(run_id=run_id, tool_call_id='failed')
        assert failed is not None
        assert (failed.status, failed.error) == (FAILED, "TimeoutError('smtp')")

    async def test_list_tool_effects_orders_by_started_at(self, store: StepStore) -> None:
        run_id = await register(store)
        for call, started in (('c', 30), ('a', 10), ('d', 40), ('b', 20)):
            await store.record_tool_effect(effect(run_id, call, started=started))
        # Updating an entry keeps its place: it is ordered by started_at, not by write time.
        await store.record_tool_effect(effect(run_id, 'a', COMPLETED, started=10, updated_at=at(99)))
        assert [r.tool_call_id for r in await store.list_tool_effects(run_id=run_id)] == ['a', 'b', 'c', 'd']
        assert [r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id=run_id)] == ['b', 'c', 'd']

    async def test_entries_are_scoped_to_their_run(self, store: StepStore) -> None:
        run_a, run_b = await register(store), await register(store)
        await store.record_tool_effect(effect(run_a, 'call-1', STARTED, tool_name='a_tool'))
        await store.record_tool_effect(effect(run_b, 'call-1', COMPLETED, tool_name='b_tool'))
        a = await store.get_tool_effect(run_id=run_a, tool_call_id='call-1')
        b = await store.get_tool_effect(run_id=run_b, tool_call_id='call-1')
        assert a is not None
        assert b is not None
        assert (a.tool_name, a.status) == ('a_tool', STARTED)
        assert (b.tool_name, b.status) == ('b_tool', COMPLETED)
        assert [r.run_id for r in await store.list_unresolved_tool_effects(run_id=run_a)] == [run_a]
        assert await store.list_unresolved_tool_effects(run_id=run_b) == []

    async def test_stored_entries_are_isolated_from_caller_objects(self, store: StepStore) -> None:
        run_id = await register(store)
        record = effect(run_id, 'call-1', args={'items': [1, 2]})
        await store.record_tool_effect(record)
        record.args['items'].append(3)
        fetched = await store.get_tool_effect(run_id=run_id, tool_call_id='call-1')
        assert fetched is not None
        assert fetched.args == {'items': [1, 2]}
