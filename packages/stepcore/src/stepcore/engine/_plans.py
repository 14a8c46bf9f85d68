"""The engine's mechanisms as plans: generators that yield operations and receive their answers.

A plan holds the decisions (which key to check, when history is stale, what retention prunes, in
which order the writes go) and no I/O, so one plan serves every port, blocking or async: a driver
sends each yielded operation to the port and the answer back into the plan. A yielded tuple is a
group of reads that do not depend on each other (an async port may send it in one round trip).
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

from stepcore.engine._ops import (
    CheckLease,
    DeleteSnapshots,
    GetNodes,
    ListSnapshots,
    Node,
    NodeExists,
    Op,
    PutEffects,
    PutEvents,
    PutSnapshot,
    SnapshotKeyApplied,
    SnapshotRow,
    SnapshotStates,
    SnapshotWrite,
    WriteStep,
)
from stepcore.store.retention import snapshots_to_prune

__all__ = (
    'Fenced',
    'KeyConflict',
    'Plan',
    'StaleHistory',
    'pruned_with',
    'read_snapshot',
    'read_snapshots',
    'write_plan',
)

T = TypeVar('T')
Plan: TypeAlias = Generator[Op | tuple[Op, ...], Any, T]

_NEWEST = sys.maxsize
"""Stands for the seq of the snapshot being saved, which is newer than every stored one."""


class StaleHistory(Exception):
    """The node a save hangs its new messages off is gone (the run was deleted or replaced)."""


class Fenced(Exception):
    """A write of a run whose lease epoch is no longer the writer's (`CheckLease`): nothing was stored."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


class KeyConflict(Exception):
    """Another writer recorded the same snapshot idempotency key meanwhile: the plan runs again."""


def write_plan(step: WriteStep) -> Plan[Sequence[int] | None]:
    """`step` one operation at a time; answers the snapshot's new node ids (`None`: not written).

    The snapshot goes first, then the ledger entries, then the events: a `completed` entry is
    never stored before the snapshot holding the call's result, and a `started` entry is stored
    before the event that announces the call. In one transaction the order does not show; without
    one, it is the order of the writes, so a crash between two of them leaves a state that obeys
    the rule (see `docs/concepts/ledger.md`).

    With an `epoch`, the writer holds the run's lease at that epoch: the transaction is checked
    against the lease first (`CheckLease`), so a writer whose lease was taken over stores nothing.
    A port with `fused_steps` carries out the same steps in one call (`WriteStep`).
    """
    run_id = step.run_id
    nodes: Sequence[int] | None = None
    if step.epoch is not None:
        yield CheckLease(run_id, step.epoch)
    if step.snapshot is not None:
        nodes = yield from _snapshot_plan(run_id, step.snapshot, step.max_snapshots)
    if step.effects:
        yield PutEffects(step.effects)
    if step.events:
        yield PutEvents(run_id, step.events)
    return nodes


def _snapshot_plan(run_id: str, snapshot: SnapshotWrite, max_snapshots: int | None) -> Plan[Sequence[int] | None]:
    reads: list[Op] = []
    if snapshot.key is not None:
        reads.append(SnapshotKeyApplied(run_id, snapshot.key))
    if snapshot.parent is not None:
        reads.append(NodeExists(run_id, snapshot.parent))
    if max_snapshots is not None:
        reads.append(SnapshotStates(run_id))
    answers: list[Any] = list((yield tuple(reads))) if reads else []
    applied = bool(answers.pop(0)) if snapshot.key is not None else False
    parent_found = bool(answers.pop(0)) if snapshot.parent is not None else True
    states: Sequence[tuple[int, str]] = answers.pop(0) if max_snapshots is not None else ()
    if applied:
        return None
    if not parent_found:
        raise StaleHistory(run_id)
    nodes: Sequence[int] = yield PutSnapshot(run_id, snapshot.key, snapshot.parent, snapshot.bodies, snapshot.row)
    if max_snapshots is not None:
        # The new snapshot is the newest: it is always kept, and it decides which complete one is.
        doomed = pruned_with(states, snapshot.row.state, max_snapshots)
        if doomed:
            yield DeleteSnapshots(run_id, doomed)
    return nodes


def pruned_with(states: Sequence[tuple[int, str]], state: str, max_snapshots: int) -> list[int]:
    """The seqs of a run's snapshots (`states`: seq and state of each) that retention prunes once a
    new snapshot in `state` is stored: the new one is the newest, always kept, and decides which
    complete one is."""
    return snapshots_to_prune([*states, (_NEWEST, state)], max_snapshots)


def read_snapshots(
    run_id: str, *, newest: bool, complete_only: bool
) -> Plan[tuple[Sequence[SnapshotRow], Mapping[int, Node]]]:
    """The run's snapshot rows (see `ListSnapshots`) and the message nodes their chains need."""
    rows: Sequence[SnapshotRow] = yield ListSnapshots(run_id, newest=newest, complete_only=complete_only)
    chains = tuple((row.head, row.length) for row in rows if row.head is not None and row.length)
    if not chains:
        return rows, {}
    nodes: Mapping[int, Node] = yield GetNodes(run_id, chains)
    return rows, nodes


def read_snapshot(run_id: str, seq: int) -> Plan[tuple[SnapshotRow | None, Mapping[int, Node]]]:
    """The snapshot row with this `seq` (or `None`) and the message nodes of its chain only."""
    rows: Sequence[SnapshotRow] = yield ListSnapshots(run_id)
    row = next((r for r in rows if r.seq == seq), None)
    if row is None or row.head is None or not row.length:
        return row, {}
    nodes: Mapping[int, Node] = yield GetNodes(run_id, ((row.head, row.length),))
    return row, nodes
