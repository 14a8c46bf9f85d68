"""`max_snapshots_per_run`: the retain set (feature `snapshot_retention`)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from stepcore import SnapshotState, StepStore
from stepcore.backend import SNAPSHOT_RETENTION

from ._declared import feature_test, refusal_verdict
from ._support import StoreFixtures, conversation, needs_feature, options, register, snapshot

__all__ = ('RetentionConformance', 'expected_retained')

COMPLETE = SnapshotState.COMPLETE
INTERRUPTED = SnapshotState.INTERRUPTED


def expected_retained(states: list[SnapshotState], bound: int) -> list[int]:
    """Indexes (in save order) a run keeps: newest `bound`, newest overall, newest complete.

    Written independently of `stepcore.store.retention` so the kit checks the rule, not the helper.
    """
    keep = set(range(max(0, len(states) - bound), len(states)))
    if states:
        keep.add(len(states) - 1)
    complete = [i for i, s in enumerate(states) if s is COMPLETE]
    if complete:
        keep.add(complete[-1])
    return sorted(keep)


class RetentionConformance(StoreFixtures):
    """Pruning on save with `max_snapshots_per_run=N`."""

    async def _save(self, store: StepStore, run_id: str, states: list[SnapshotState], **fields: Any) -> None:
        for step, state in enumerate(states):
            await store.save_snapshot(snapshot(run_id, conversation(step), step_index=step, state=state, **fields))

    async def _retained_steps(self, store: StepStore, run_id: str) -> list[int]:
        listed = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        for s in listed:
            assert s.messages == conversation(s.step_index), f'snapshot of step {s.step_index} changed after pruning'
        return [s.step_index for s in listed]

    async def test_unbounded_by_default(self, store: StepStore) -> None:
        run_id = await register(store)
        await self._save(store, run_id, [COMPLETE] * 15)
        assert await self._retained_steps(store, run_id) == list(range(15))

    @options({'max_snapshots_per_run': 2})
    @needs_feature(SNAPSHOT_RETENTION)
    async def test_keeps_the_newest_n(self, store: StepStore) -> None:
        run_id = await register(store)
        await self._save(store, run_id, [COMPLETE] * 6)
        assert await self._retained_steps(store, run_id) == [4, 5]

    @options({'max_snapshots_per_run': 2})
    @needs_feature(SNAPSHOT_RETENTION)
    async def test_keeps_the_newest_complete_below_an_interrupted_window(self, store: StepStore) -> None:
        run_id = await register(store)
        await self._save(store, run_id, [COMPLETE, COMPLETE, INTERRUPTED, INTERRUPTED, INTERRUPTED, INTERRUPTED])
        # The retain set exceeds N: step 1 is the newest complete snapshot.
        assert await self._retained_steps(store, run_id) == [1, 4, 5]
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.step_index == 1
        assert latest.messages == conversation(1)
        newest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
        assert newest is not None
        assert newest.step_index == 5

    @options({'max_snapshots_per_run': 1})
    @needs_feature(SNAPSHOT_RETENTION)
    async def test_bound_of_one_keeps_newest_and_newest_complete(self, store: StepStore) -> None:
        run_id = await register(store)
        await self._save(store, run_id, [COMPLETE, INTERRUPTED])
        assert await self._retained_steps(store, run_id) == [0, 1]
        await store.save_snapshot(snapshot(run_id, conversation(2), step_index=2, state=COMPLETE))
        assert await self._retained_steps(store, run_id) == [2]

    @options({'max_snapshots_per_run': 3})
    @needs_feature(SNAPSHOT_RETENTION)
    async def test_retain_set_after_every_save(self, store: StepStore) -> None:
        run_id = await register(store)
        rng = random.Random(20260101)
        states: list[SnapshotState] = []
        for step in range(30):
            state = COMPLETE if rng.random() < 0.3 else INTERRUPTED
            states.append(state)
            await store.save_snapshot(snapshot(run_id, conversation(step), step_index=step, state=state))
            assert await self._retained_steps(store, run_id) == expected_retained(states, 3), f'after save {step}'

    @options({'max_snapshots_per_run': 2})
    @needs_feature(SNAPSHOT_RETENTION)
    async def test_seq_keeps_increasing_after_pruning(self, store: StepStore) -> None:
        run_id = await register(store)
        seen: list[int] = []
        for step in range(6):
            await store.save_snapshot(snapshot(run_id, conversation(step), step_index=step))
            newest = await store.latest_snapshot(run_id=run_id)
            assert newest is not None
            assert newest.seq is not None
            seen.append(newest.seq)
        assert seen == sorted(set(seen)), f'a pruned seq was reused: {seen}'

    @options({'max_snapshots_per_run': 1})
    @needs_feature(SNAPSHOT_RETENTION)
    async def test_pruned_snapshot_keys_stay_suppressed(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(0), step_index=0, idempotency_key='save-0'))
        await store.save_snapshot(snapshot(run_id, conversation(1), step_index=1, idempotency_key='save-1'))
        assert await self._retained_steps(store, run_id) == [1]
        # A replay of the pruned save must not come back.
        await store.save_snapshot(snapshot(run_id, conversation(0), step_index=0, idempotency_key='save-0'))
        assert await self._retained_steps(store, run_id) == [1]

    @options({'max_snapshots_per_run': 2})
    @needs_feature(SNAPSHOT_RETENTION)
    async def test_pruning_is_per_run(self, store: StepStore) -> None:
        run_a, run_b = await register(store), await register(store)
        await self._save(store, run_a, [COMPLETE] * 2)
        await self._save(store, run_b, [COMPLETE] * 5)
        assert await self._retained_steps(store, run_a) == [0, 1]
        assert await self._retained_steps(store, run_b) == [3, 4]

    @options({'max_snapshots_per_run': 2})
    @needs_feature(SNAPSHOT_RETENTION)
    async def test_retained_snapshots_read_back_after_history_rewrites(self, store: StepStore) -> None:
        run_id = await register(store)
        long = conversation(8)
        await store.save_snapshot(snapshot(run_id, long, step_index=0))
        await store.save_snapshot(snapshot(run_id, long[:3], step_index=1))  # compaction
        await store.save_snapshot(snapshot(run_id, conversation(8), step_index=2))
        await store.save_snapshot(snapshot(run_id, [*long, *conversation(1, tag='more')], step_index=3))
        listed = await store.list_snapshots(run_id=run_id)
        assert [s.messages for s in listed] == [conversation(8), [*conversation(8), *conversation(1, tag='more')]]

    @options(
        {'max_snapshots_per_run': 0},
        {'max_snapshots_per_run': -1},
        {'max_snapshots_per_run': False},
        {'max_snapshots_per_run': 1.5},
        {'max_snapshots_per_run': '2'},
        {'max_snapshots_per_run': True},
    )
    @feature_test(SNAPSHOT_RETENTION)
    def test_invalid_bound_is_rejected(self, request: pytest.FixtureRequest, store_options: dict[str, Any]) -> None:
        bound: object = store_options['max_snapshots_per_run']
        rejection: ValueError | None = None
        try:
            request.getfixturevalue('store')
        except NotImplementedError as error:
            refusal_verdict(error, (SNAPSHOT_RETENTION,), 'feature')
        except ValueError as error:
            rejection = error
        if rejection is None:
            pytest.fail(f'max_snapshots_per_run={bound!r} was accepted; it must raise ValueError')
        # The phrases callers match on: one for a value of another type (a bool is not a count),
        # one for an int below 1 (False counts as 0).
        is_count = isinstance(bound, int) and not isinstance(bound, bool)
        phrase = (
            'max_snapshots_per_run must be >= 1'
            if bound is False or is_count
            else 'max_snapshots_per_run must be an int'
        )
        assert phrase in str(rejection), f'the error does not say {phrase!r}: {rejection}'
        assert repr(bound) in str(rejection), f'the error does not show the value {bound!r}: {rejection}'
