"""`write_batch`: several event and ledger writes, and a snapshot, in one call (every `StepStore` has it)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from stepcore import EventKind, SnapshotState, StepEvent, StepStore, ToolEffectRecord, ToolEffectStatus
from stepcore.backend import StepWrite, write_records

from ._support import StoreFixtures, at, canonical, conversation, event, register, snapshot

__all__ = ('BatchWritesConformance',)


def _effect(
    run_id: str, call: str, status: ToolEffectStatus = ToolEffectStatus.STARTED, **fields: Any
) -> ToolEffectRecord:
    fields.setdefault('started_at', at(1))
    fields.setdefault('updated_at', at(2))
    return ToolEffectRecord(run_id=run_id, tool_call_id=call, tool_name='lookup', status=status, **fields)


class BatchWritesConformance(StoreFixtures):
    """`write_batch` applies each write exactly as the single-record methods would."""

    async def test_mixed_batch_matches_single_writes(self, store: StepStore) -> None:
        batched, single = await register(store), await register(store)

        def writes(run_id: str) -> list[StepWrite]:
            return [
                event(run_id, 0, idempotency_key='mr:1'),
                _effect(run_id, 'call-1', args={'q': 'x'}),
                event(run_id, 1, kind=EventKind.TOOL_CALL_STARTED, tool_call_id='call-1', idempotency_key='ts:1'),
                _effect(run_id, 'call-1', ToolEffectStatus.COMPLETED, args={'q': 'x'}, effect_summary='sent'),
                event(run_id, 2, kind=EventKind.TOOL_CALL_COMPLETED, tool_call_id='call-1', metadata={'k': 'v'}),
            ]

        await store.write_batch(writes(batched))
        for write in writes(single):
            if isinstance(write, StepEvent):
                await store.append_event(write)
            else:
                await store.record_tool_effect(write)

        def strip(events: list[StepEvent]) -> list[StepEvent]:
            return [dataclasses.replace(e, seq=None, run_id='') for e in events]

        assert strip(await store.list_events(run_id=batched)) == strip(await store.list_events(run_id=single))
        [effect] = await store.list_tool_effects(run_id=batched)
        assert effect.status is ToolEffectStatus.COMPLETED, 'a later ledger entry in the batch must win'
        [single_effect] = await store.list_tool_effects(run_id=single)
        assert dataclasses.replace(effect, run_id='') == dataclasses.replace(single_effect, run_id='')
        assert await store.list_unresolved_tool_effects(run_id=batched) == []

    async def test_events_keep_order_and_seq_after_single_appends(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.append_event(event(run_id, 0))
        await store.write_batch([event(run_id, 1), event(run_id, 2)])
        await store.append_event(event(run_id, 3))
        await store.write_batch([event(run_id, 4)])
        listed = await store.list_events(run_id=run_id)
        assert [e.step_index for e in listed] == [0, 1, 2, 3, 4]
        seqs = [e.seq or 0 for e in listed]
        assert all(isinstance(e.seq, int) for e in listed), seqs
        assert seqs == sorted(seqs), seqs
        assert len(set(seqs)) == 5, seqs

    async def test_idempotency_keys_within_and_across_batches(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.append_event(event(run_id, 0, idempotency_key='a'))
        await store.write_batch(
            [
                event(run_id, 1, idempotency_key='a'),  # applied before: suppressed
                event(run_id, 2, idempotency_key='b'),
                event(run_id, 3, idempotency_key='b'),  # repeated within the batch: applied once
                event(run_id, 4),
                event(run_id, 5),  # None keys always append
            ]
        )
        await store.write_batch([event(run_id, 6, idempotency_key='b')])  # a replayed batch
        assert [e.step_index for e in await store.list_events(run_id=run_id)] == [0, 2, 4, 5]

    async def test_batch_spanning_runs(self, store: StepStore) -> None:
        first, second = await register(store), await register(store)
        await store.write_batch(
            [event(first, 0), _effect(second, 'c'), event(second, 1), event(first, 2), _effect(first, 'c')]
        )
        assert [e.step_index for e in await store.list_events(run_id=first)] == [0, 2]
        assert [e.step_index for e in await store.list_events(run_id=second)] == [1]
        assert [r.run_id for r in await store.list_tool_effects(run_id=first)] == [first]
        assert [r.run_id for r in await store.list_tool_effects(run_id=second)] == [second]

    async def test_empty_batch_writes_nothing(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.write_batch([])
        assert await store.list_events(run_id=run_id) == []
        assert await store.list_tool_effects(run_id=run_id) == []

    async def test_other_records_are_refused_before_anything_is_written(self, store: StepStore) -> None:
        run_id = await register(store)
        with pytest.raises(TypeError, match='write_batch got'):
            await store.write_batch([event(run_id, 0), 'not a record'])  # pyright: ignore[reportArgumentType]
        assert await store.list_events(run_id=run_id) == []

    async def test_write_records_helper_uses_the_same_semantics(self, store: StepStore) -> None:
        run_id = await register(store)
        await write_records(store, [_effect(run_id, 'x'), event(run_id, 0, idempotency_key='k')])
        await write_records(store, [event(run_id, 1, idempotency_key='k')])
        await write_records(store, [])
        assert [e.step_index for e in await store.list_events(run_id=run_id)] == [0]
        assert [r.tool_call_id for r in await store.list_unresolved_tool_effects(run_id=run_id)] == ['x']

    async def test_batch_with_a_snapshot_saves_snapshot_and_records(self, store: StepStore) -> None:
        run_id = await register(store)
        first, second = conversation(1), conversation(2)
        await store.write_batch([event(run_id, 0)], snapshot=snapshot(run_id, first, 1, idempotency_key='s:1'))
        await store.write_batch(
            [_effect(run_id, 'c', ToolEffectStatus.COMPLETED), event(run_id, 1)],
            snapshot=snapshot(run_id, second, 2, SnapshotState.INTERRUPTED, idempotency_key='s:2'),
        )
        await store.write_batch([], snapshot=snapshot(run_id, second, 3, idempotency_key='s:3'))
        # a replayed batch: its records are applied as usual, its snapshot key is suppressed
        await store.write_batch(
            [event(run_id, 2)], snapshot=snapshot(run_id, conversation(3), 4, idempotency_key='s:1')
        )
        snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        assert [(s.step_index, s.state) for s in snapshots] == [
            (1, SnapshotState.COMPLETE),
            (2, SnapshotState.INTERRUPTED),
            (3, SnapshotState.COMPLETE),
        ]
        assert [s.messages for s in snapshots] == [canonical(first), canonical(second), canonical(second)]
        assert [e.step_index for e in await store.list_events(run_id=run_id)] == [0, 1, 2]
        [effect] = await store.list_tool_effects(run_id=run_id)
        assert effect.status is ToolEffectStatus.COMPLETED
        latest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
        assert latest is not None
        assert latest.step_index == 3

    async def test_write_records_with_a_snapshot(self, store: StepStore) -> None:
        run_id = await register(store)
        await write_records(store, [event(run_id, 0)], snapshot=snapshot(run_id, conversation(1), 1))
        await write_records(store, [], snapshot=snapshot(run_id, conversation(2), 2))
        assert [s.step_index for s in await store.list_snapshots(run_id=run_id)] == [1, 2]
        assert [e.step_index for e in await store.list_events(run_id=run_id)] == [0]
