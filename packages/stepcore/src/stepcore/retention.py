"""The snapshot retain set for `max_snapshots_per_run`, shared by every store."""

from __future__ import annotations

from collections.abc import Iterable

from .models import SnapshotState

__all__ = ('check_max_snapshots', 'snapshots_to_prune')


def check_max_snapshots(value: int | None) -> int | None:
    """Validate a `max_snapshots_per_run` option: `None` (unbounded) or an integer >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f'max_snapshots_per_run={value!r} must be None (keep all) or an integer >= 1')
    return value


def snapshots_to_prune(snapshots: Iterable[tuple[int, SnapshotState | str]], max_snapshots: int | None) -> list[int]:
    """The seqs to delete so that a run keeps its retain set.

    Kept: the newest `max_snapshots` by seq, the newest snapshot overall and the newest complete
    snapshot (so both read modes of `latest_snapshot` keep working). The result is ascending.
    """
    if max_snapshots is None:
        return []
    ordered = sorted(snapshots, key=lambda item: item[0])
    if len(ordered) <= max_snapshots:
        return []
    keep = {seq for seq, _ in ordered[-max_snapshots:]}
    keep.add(ordered[-1][0])
    for seq, state in reversed(ordered):
        if SnapshotState(state) is SnapshotState.COMPLETE:
            keep.add(seq)
            break
    return [seq for seq, _ in ordered if seq not in keep]
