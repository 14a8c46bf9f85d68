"""The snapshot retain set for `max_snapshots_per_run`, shared by every store."""

from __future__ import annotations

from collections.abc import Iterable

from stepcore.store.models import SnapshotState

__all__ = ('check_max_snapshots', 'snapshots_to_prune')


def check_max_snapshots(value: int | None) -> int | None:
    """Validate a `max_snapshots_per_run` option: `None` (unbounded) or an integer >= 1.

    The messages carry the phrases callers match on: "max_snapshots_per_run must be an int" for a
    value of another type (a bool included: `True` is not a count), "max_snapshots_per_run must
    be >= 1" for an int below 1 (and for `False`, which is 0).
    """
    if value is None:
        return None
    candidate: object = value
    if candidate is False or (isinstance(candidate, int) and not isinstance(candidate, bool) and candidate < 1):
        raise ValueError(
            f'max_snapshots_per_run must be >= 1 or None, got {value!r}: pass how many snapshots to keep per run, '
            'or None to keep every snapshot'
        )
    if isinstance(candidate, bool) or not isinstance(candidate, int):
        raise ValueError(
            f'max_snapshots_per_run must be an int >= 1 or None, got {value!r} ({type(candidate).__name__}): '
            'pass how many snapshots to keep per run, or None to keep every snapshot'
        )
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
