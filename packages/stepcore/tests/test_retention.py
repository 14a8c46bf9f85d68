"""The retain set for `max_snapshots_per_run`."""

from __future__ import annotations

import itertools

import pytest

from stepcore.store.models import SnapshotState
from stepcore.store.retention import check_max_snapshots, snapshots_to_prune

C = SnapshotState.COMPLETE
I = SnapshotState.INTERRUPTED  # noqa: E741


def seqs(states: list[SnapshotState], start: int = 1) -> list[tuple[int, SnapshotState]]:
    return [(start + i, s) for i, s in enumerate(states)]


@pytest.mark.parametrize('value', [None, 1, 2, 1000])
def test_valid_bounds(value: int | None) -> None:
    assert check_max_snapshots(value) == value


@pytest.mark.parametrize('value', [0, -3, True, False, 1.0, '2'])
def test_invalid_bounds_name_the_option_and_value(value: object) -> None:
    with pytest.raises(ValueError, match='max_snapshots_per_run') as raised:
        check_max_snapshots(value)  # type: ignore[arg-type]
    assert repr(value) in str(raised.value)


def test_unbounded_prunes_nothing() -> None:
    assert snapshots_to_prune(seqs([C] * 50), None) == []


def test_at_or_under_the_bound_prunes_nothing() -> None:
    assert snapshots_to_prune(seqs([I, I, C]), 3) == []


def test_keeps_the_newest_n() -> None:
    assert snapshots_to_prune(seqs([C] * 5), 2) == [1, 2, 3]


def test_keeps_the_newest_complete_below_the_window() -> None:
    assert snapshots_to_prune(seqs([C, C, I, I, I, I]), 2) == [1, 3, 4]


def test_bound_of_one_with_interrupted_newest() -> None:
    assert snapshots_to_prune(seqs([C, I]), 1) == []
    assert snapshots_to_prune(seqs([C, I, I]), 1) == [2]


def test_no_complete_snapshot_at_all() -> None:
    assert snapshots_to_prune(seqs([I] * 4), 2) == [1, 2]


def test_input_order_and_gaps_do_not_matter() -> None:
    items = [(9, I), (2, C), (30, I), (4, C), (17, I)]
    assert snapshots_to_prune(items, 2) == [2, 9]


def test_states_may_be_given_as_strings() -> None:
    assert snapshots_to_prune([(1, 'complete'), (2, 'interrupted'), (3, 'interrupted')], 1) == [2]


def test_matches_the_rule_for_every_short_sequence() -> None:
    for length in range(1, 7):
        for states in itertools.product([C, I], repeat=length):
            for bound in range(1, length + 1):
                items = seqs(list(states))
                keep = {seq for seq, _ in items[-bound:]} | {items[-1][0]}
                completes = [seq for seq, s in items if s is C]
                if completes:
                    keep.add(completes[-1])
                assert snapshots_to_prune(items, bound) == [seq for seq, _ in items if seq not in keep]
