"""Data outlives the store object (feature `persistent`, needs the `store_spec` fixture)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest

import stepcore
from stepcore import RunRecord, StepStore, ToolEffectStatus
from stepcore.backend import PERSISTENT

from ._support import StoreFixtures, at, conversation, event, needs_feature, new_id, snapshot, tool_exchange
from .effects import effect

__all__ = ('PersistenceConformance', 'second_store')


@asynccontextmanager
async def second_store(spec: dict[str, Any] | None) -> AsyncIterator[StepStore]:
    """Another store over the same data, built from `store_spec` (the feature gate made sure there is one)."""
    assert spec is not None
    other = cast(StepStore, stepcore.from_spec(**spec))
    try:
        yield other
    finally:
        await other.aclose()


class PersistenceConformance(StoreFixtures):
    """A second store built from `store_spec` sees, and can continue, what the first one wrote."""

    @needs_feature(PERSISTENT)
    async def test_a_new_store_reads_everything(self, store: StepStore, store_spec: dict[str, Any] | None) -> None:
        async with second_store(store_spec) as other:
            record = RunRecord(
                run_id=new_id('run'), conversation_id=new_id('conv'), metadata={'k': 'v'}, started_at=at(1)
            )
            await store.register_run(record)
            run_id = record.run_id
            await store.append_event(event(run_id, 1, idempotency_key='e1'))
            saved = snapshot(run_id, conversation(3), step_index=3, idempotency_key='s1')
            await store.save_snapshot(saved)
            await store.record_tool_effect(effect(run_id, 'call-1', ToolEffectStatus.STARTED))
            assert await other.get_run(run_id) == record
            assert await other.list_runs(conversation_id=record.conversation_id) == [record]
            assert await other.list_events(run_id) == await store.list_events(run_id=run_id)
            assert await other.list_snapshots(run_id, include_interrupted=True) == await store.list_snapshots(
                run_id=run_id, include_interrupted=True
            )
            assert [r.tool_call_id for r in await other.list_unresolved_tool_effects(run_id)] == ['call-1']
            # The second store knows the keys and the registration the first one applied.
            await other.append_event(event(run_id, 2, idempotency_key='e1'))
            await other.save_snapshot(snapshot(run_id, conversation(4), step_index=4, idempotency_key='s1'))
            assert len(await store.list_events(run_id=run_id)) == 1
            assert len(await store.list_snapshots(run_id=run_id)) == 1
            with pytest.raises(ValueError, match=run_id):
                await other.register_run(RunRecord(run_id=run_id))

    @needs_feature(PERSISTENT)
    async def test_history_continued_by_another_store(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        async with second_store(store_spec) as other:
            run_id = new_id('run')
            await store.register_run(RunRecord(run_id=run_id, started_at=at(0)))
            live = conversation(3)
            await store.save_snapshot(snapshot(run_id, live, step_index=1))
            # The second store has never seen this run's history; the first one's memory of it
            # goes stale once the second writes. Both must still store every snapshot exactly.
            live_b = [*live, *tool_exchange(3)]
            await other.save_snapshot(snapshot(run_id, live_b, step_index=2))
            live_a = [*live, *tool_exchange(4), *tool_exchange(5)]
            await store.save_snapshot(snapshot(run_id, live_a, step_index=3))
            await other.save_snapshot(snapshot(run_id, live_b[:2], step_index=4))
            expected = [conversation(3), [*conversation(3), *tool_exchange(3)], live_a, conversation(3)[:2]]
            for reader in (store, other):
                assert [s.messages for s in await reader.list_snapshots(run_id)] == expected
