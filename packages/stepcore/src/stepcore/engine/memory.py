"""`InMemoryStepStore`: process-local, for tests and short-lived agents."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stepcore.common.encryption import Encryption
from stepcore.common.features import CHECKSUMS, ENCRYPTION, LEASES, SNAPSHOT_RETENTION
from stepcore.engine import _ops as ops
from stepcore.engine._engine_store import EngineStore
from stepcore.engine._plans import Fenced, KeyConflict, StaleHistory, pruned_with
from stepcore.engine._port import SyncPort
from stepcore.media.protocol import MediaStoreOption
from stepcore.store.models import SnapshotState

__all__ = ('InMemoryStepStore', 'MemoryPort')


@dataclass(slots=True)
class _Run:
    events: list[ops.EventRow] = field(default_factory=list[ops.EventRow])
    event_keys: set[str] = field(default_factory=set[str])
    nodes: dict[int, ops.Node] = field(default_factory=dict[int, ops.Node])
    snapshots: list[ops.SnapshotRow] = field(default_factory=list[ops.SnapshotRow])
    snapshot_keys: set[str] = field(default_factory=set[str])
    next_snapshot_seq: int = 1
    effects: dict[str, ops.EffectRow] = field(default_factory=dict[str, ops.EffectRow])


class MemoryPort(SyncPort):
    """Rows in dictionaries, written and read inline on the event loop (every operation is atomic there)."""

    gapless_events = True  # seqs follow list positions

    name = 'memory store'

    def __init__(self) -> None:
        super().__init__(worker=None)
        self._runs: dict[str, ops.RunRow] = {}
        self._data: dict[str, _Run] = {}
        self._next_node = 1
        self._leases: dict[str, ops.LeaseRow] = {}
        self._starts: dict[str, bytes] = {}
        self._identity: str | None = None
        """The store's id (`ops.StoreIdentity`): each memory store is a store of its own."""

    def describe(self) -> str:
        return 'process memory'

    def _run(self, run_id: str) -> _Run:
        data = self._data.get(run_id)
        if data is None:
            data = self._data[run_id] = _Run()
        return data

    def insert_run(self, tx: Any, op: ops.InsertRun) -> ops.RunRow | None:
        existing = self._runs.get(op.row.run_id)
        if existing is None:
            self._runs[op.row.run_id] = op.row
        return existing

    def get_run(self, tx: Any, op: ops.GetRun) -> ops.RunRow | None:
        return self._runs.get(op.run_id)

    def list_runs(self, tx: Any, op: ops.ListRuns) -> list[ops.RunRow]:
        return op.pick(self._runs.values())

    def list_run_ids(self, tx: Any, op: ops.ListRunIds) -> list[str]:
        return list(self._runs.keys() | {r for r, data in self._data.items() if data.snapshots})

    def delete_run(self, tx: Any, op: ops.DeleteRun) -> bool:
        had_row = self._runs.pop(op.run_id, None) is not None
        had_lease = self._leases.pop(op.run_id, None) is not None
        self._starts.pop(op.run_id, None)
        return self._data.pop(op.run_id, None) is not None or had_row or had_lease

    def store_identity(self, tx: Any, op: ops.StoreIdentity) -> str:
        if self._identity is None:
            self._identity = op.new_id
        return self._identity

    # -- leases: every operation runs whole on the event loop, so each is atomic --------------

    def get_lease(self, tx: Any, op: ops.GetLease) -> ops.LeaseRead:
        return ops.LeaseRead(self._leases.get(op.run_id), time.time())

    def swap_lease(self, tx: Any, op: ops.SwapLease) -> ops.LeaseSwap:
        now = time.time()
        current = self._leases.get(op.run_id)
        if not op.matches(current, now):
            return ops.LeaseSwap(False, ops.LeaseRead(current, now))
        stored = self._leases[op.run_id] = op.stored(now)
        if op.start is not None:
            self._starts[op.run_id] = op.start
        return ops.LeaseSwap(True, ops.LeaseRead(stored, now))

    def list_leases(self, tx: Any, op: ops.ListLeases) -> tuple[list[ops.LeaseRow], float]:
        return [row for row in self._leases.values() if row.state in op.states], time.time()

    def get_lease_start(self, tx: Any, op: ops.GetLeaseStart) -> bytes | None:
        return self._starts.get(op.run_id)

    def check_lease(self, tx: Any, op: ops.CheckLease) -> None:
        current = self._leases.get(op.run_id)
        if current is None or current.epoch != op.epoch:
            raise Fenced(op.run_id)

    def put_events(self, tx: Any, op: ops.PutEvents) -> None:
        self._put_events(op.run_id, op.rows)

    def _put_events(self, run_id: str, rows: Sequence[ops.EventRow]) -> None:
        data = self._run(run_id)
        for row in rows:
            key = row.idempotency_key
            if key is not None:
                if key in data.event_keys:
                    continue
                data.event_keys.add(key)
            data.events.append(ops.EventRow(run_id, key, row.body, seq=len(data.events) + 1))

    def list_events(self, tx: Any, op: ops.ListEvents) -> list[ops.EventRow]:
        data = self._data.get(op.run_id)
        if data is None:
            return []
        start = op.after_seq or 0  # seq n sits at index n - 1
        rows = data.events[start:]
        if op.limit is not None:
            rows = rows[-op.limit :] if op.newest else rows[: op.limit]
        return list(rows)

    def put_effects(self, tx: Any, op: ops.PutEffects) -> None:
        self._put_effects(op.rows)

    def _put_effects(self, rows: Sequence[ops.EffectRow]) -> None:
        for row in rows:
            self._run(row.run_id).effects[row.tool_call_id] = row

    def list_effects(self, tx: Any, op: ops.ListEffects) -> list[ops.EffectRow] | int:
        data = self._data.get(op.run_id)
        if data is None:
            return 0 if op.count and op.tool_call_id is None else []
        if op.count and op.tool_call_id is None:
            return len(data.effects)
        if op.tool_call_id is not None:
            row = data.effects.get(op.tool_call_id)
            return [row] if row is not None else []
        return list(data.effects.values())

    def snapshot_key_applied(self, tx: Any, op: ops.SnapshotKeyApplied) -> bool:
        data = self._data.get(op.run_id)
        return data is not None and op.key in data.snapshot_keys

    def node_exists(self, tx: Any, op: ops.NodeExists) -> bool:
        data = self._data.get(op.run_id)
        return data is not None and op.node in data.nodes

    def snapshot_states(self, tx: Any, op: ops.SnapshotStates) -> list[tuple[int, str]]:
        # the pairs even for a summary: they are at hand, and the engine sums them up as it would
        data = self._data.get(op.run_id)
        return [(s.seq or 0, s.state) for s in data.snapshots] if data is not None else []

    def put_snapshot(self, tx: Any, op: ops.PutSnapshot) -> list[int]:
        data = self._run(op.run_id)
        if op.key is not None and op.key in data.snapshot_keys:
            raise KeyConflict(op.key)
        return self._put_snapshot(data, op.run_id, op.key, op.parent, op.bodies, op.row)

    def _put_snapshot(
        self,
        data: _Run,
        run_id: str,
        key: str | None,
        parent: int | None,
        bodies: Sequence[bytes],
        row: ops.SnapshotRow,
    ) -> list[int]:
        ids = list(range(self._next_node, self._next_node + len(bodies)))
        self._next_node += len(bodies)
        for node, body in zip(ids, bodies, strict=True):
            data.nodes[node] = (parent, body)
            parent = node
        seq = data.next_snapshot_seq
        data.next_snapshot_seq += 1
        data.snapshots.append(ops.SnapshotRow(run_id, row.state, parent, row.length, row.body, seq=seq))
        if key is not None:
            data.snapshot_keys.add(key)
        return ids

    def delete_snapshots(self, tx: Any, op: ops.DeleteSnapshots) -> None:
        data = self._run(op.run_id)
        doomed = set(op.seqs)
        data.snapshots = [s for s in data.snapshots if s.seq not in doomed]

    def list_snapshots(self, tx: Any, op: ops.ListSnapshots) -> list[ops.SnapshotRow]:
        data = self._data.get(op.run_id)
        if data is None:
            return []
        rows = data.snapshots
        if op.complete_only:
            rows = [s for s in rows if s.state == SnapshotState.COMPLETE.value]
        return rows[-1:] if op.newest else list(rows)

    fused_steps = True

    def write_step(self, tx: Any, op: ops.WriteStep) -> list[int] | None:
        run_id = op.run_id
        if op.epoch is not None:
            current = self._leases.get(run_id)
            if current is None or current.epoch != op.epoch:
                raise Fenced(run_id)
        nodes: list[int] | None = None
        snapshot = op.snapshot
        if snapshot is not None:
            data = self._run(run_id)
            if snapshot.key is None or snapshot.key not in data.snapshot_keys:
                if snapshot.parent is not None and snapshot.parent not in data.nodes:
                    raise StaleHistory(run_id)
                states = [(s.seq or 0, s.state) for s in data.snapshots] if op.max_snapshots is not None else None
                nodes = self._put_snapshot(data, run_id, snapshot.key, snapshot.parent, snapshot.bodies, snapshot.row)
                if states is not None and op.max_snapshots is not None:
                    doomed = set(pruned_with(states, snapshot.row.state, op.max_snapshots))
                    if doomed:
                        data.snapshots = [s for s in data.snapshots if s.seq not in doomed]
        if op.effects:
            self._put_effects(op.effects)
        if op.events:
            self._put_events(run_id, op.events)
        return nodes

    def get_nodes(self, tx: Any, op: ops.GetNodes) -> dict[int, ops.Node]:
        data = self._data.get(op.run_id)
        return data.nodes if data is not None else {}


class InMemoryStepStore(EngineStore):
    """Keeps everything in process memory.

    Records are kept encoded, as the persistent stores keep them, and snapshots use the same
    incremental node scheme: a later mutation of a message object never changes a stored snapshot,
    and a long run does not pay a full copy of its history per step.

    It has no media store: with `media_store='auto'` (the default) or `None`, every payload stays
    in the snapshot. A media store of your own is refused (the store does not declare
    `media_externalization`).
    """

    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION, ENCRYPTION, CHECKSUMS, LEASES})

    def __init__(
        self,
        *,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStoreOption = 'auto',
        media_threshold_bytes: int | None = None,
        encryption: Encryption | None = None,
    ) -> None:
        super().__init__(
            MemoryPort(),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
            encryption=encryption,
        )
