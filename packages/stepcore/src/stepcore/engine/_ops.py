"""What the engine asks of a backend: rows and the operations on them.

The engine turns records into rows (a few columns a backend indexes, plus an encoded `body`) and
describes each piece of I/O as one of the operations below. A backend's port carries out each
operation in its own way (a SQL statement, a file append, a document insert) and answers with
plain values. Everything else, which operations run in which order and what their answers mean,
is the engine's.

A row's `body` is the record encoded by the engine (compact JSON, stamped with the record format
version). On the way back a port may hand a body over in whatever form it kept: the bytes or text
it was given, or a mapping (a document store's native form). The engine fills the row's columns
back into the record, so a backend that keeps a field in a column need not repeat it in the body.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, TypeAlias

from stepcore.store.lifecycle import sort_time

__all__ = (
    'Body',
    'CheckIntegrity',
    'CheckLease',
    'DeleteRun',
    'DeleteSnapshots',
    'EffectRow',
    'EventRow',
    'GetLease',
    'GetLeaseStart',
    'GetNodes',
    'GetRun',
    'InsertRun',
    'LeaseRead',
    'LeaseRow',
    'LeaseSwap',
    'ListEffects',
    'ListEvents',
    'ListLeases',
    'ListRunIds',
    'ListRuns',
    'ListSnapshots',
    'Node',
    'NodeExists',
    'Op',
    'PutEffects',
    'PutEvents',
    'PutSnapshot',
    'RunRow',
    'SnapshotKeyApplied',
    'SnapshotRow',
    'SnapshotStates',
    'SnapshotWrite',
    'StoreIdentity',
    'StoreLocation',
    'SwapLease',
    'Unparsable',
    'Unreadable',
    'WriteStep',
    'legacy_step_index',
)


@dataclass(frozen=True, slots=True)
class Unreadable:
    """The body of a record a port found but could not read (an I/O error, a directory where a file
    should be): the engine reports the record as damaged and *unreadable*, with `reason`."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unparsable:
    """The body of a record a port read but cannot take apart (its own framing is broken, a document
    that does not convert): the engine reports the record as damaged and *unparsable*, with `reason`.

    A body the port can hand over as it is (bytes that may not decode) needs no wrapper: the engine
    finds out itself, and reports it the same way.
    """

    reason: str


Body: TypeAlias = bytes | str | Mapping[str, Any] | Unreadable | Unparsable
"""An encoded record as a port keeps it (see the module docstring), or `Unreadable` / `Unparsable`."""

Node: TypeAlias = tuple[int | None, bytes]
"""One stored message: `(parent node id, stored message body)`."""


# -- rows -------------------------------------------------------------------------------------


@dataclass(slots=True)
class RunRow:
    run_id: str
    started_at: datetime
    conversation_id: str | None
    parent_run_id: str | None
    body: Body


@dataclass(slots=True)
class EventRow:
    run_id: str
    idempotency_key: str | None
    body: Body
    seq: int | None = None
    """Assigned by the port when the event is appended."""


@dataclass(slots=True)
class EffectRow:
    run_id: str
    tool_call_id: str
    status: str
    started_at: datetime
    body: Body


@dataclass(slots=True)
class SnapshotRow:
    run_id: str
    state: str
    head: int | None
    """The newest message node of the snapshot (`None` for an empty history)."""
    length: int
    """How many messages the snapshot holds: the chain from `head` back this many nodes."""
    body: Body
    """The snapshot's other fields (its header), without the messages."""
    seq: int | None = None
    """Assigned by the port when the snapshot is stored."""


@dataclass(slots=True)
class LeaseRow:
    """A run's lease (see `stepcore.store.leases`): the columns a port indexes or compares, and a body.

    `epoch` grows with every change of owner; `state` is a `LeaseState` value; `host` is the owner's
    host (`''` for none), `expires` when the hold ends, in seconds since the Unix epoch on the port's
    clock (the server's, where there is one); `body` the rest, as the engine encoded it (compact JSON
    text: a port keeps it as given and answers it as text or bytes).
    """

    run_id: str
    epoch: int
    state: str
    host: str
    expires: float
    body: str | bytes


@dataclass(frozen=True, slots=True)
class LeaseRead:
    """A lease as a port read it (`None`: the run has none), and the port's clock at that moment."""

    row: LeaseRow | None
    now: float
    """Seconds since the Unix epoch on the port's clock, the one `expires` is on."""


@dataclass(frozen=True, slots=True)
class LeaseSwap:
    """The answer of `SwapLease`: whether it stored the new lease, and the lease as it is now."""

    swapped: bool
    read: LeaseRead


def legacy_step_index(body: Body) -> int:
    """The `step_index` a snapshot row's body holds in clear, else 0.

    For a port whose stored format has a step-index slot of its own from earlier versions (a column,
    a field), which those versions fill on write and read back but never use: the engine keeps the
    step index in the body only. An encrypted body's step index is not in clear, so its slot is 0.
    """
    data: object = body
    if isinstance(body, bytes | str):
        try:
            data = json.loads(body)
        except ValueError:
            return 0
    value = data.get('step_index') if isinstance(data, Mapping) else None  # pyright: ignore[reportUnknownMemberType]
    return value if type(value) is int else 0


# -- operations -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Op:
    """One operation; `method` names the port method that carries it out."""

    method: ClassVar[str]
    writes: ClassVar[bool] = False
    """Whether the operation changes stored data (the engine marks a fault boundary before it)."""


@dataclass(frozen=True, slots=True)
class InsertRun(Op):
    """Insert the run's row unless a row with its run id exists. Answer: `None` when inserted,
    else the existing row (atomically: of two concurrent inserts of one id, exactly one inserts)."""

    method: ClassVar[str] = 'insert_run'
    writes: ClassVar[bool] = True
    row: RunRow


@dataclass(frozen=True, slots=True)
class GetRun(Op):
    """Answer: the run's row, or `None`."""

    method: ClassVar[str] = 'get_run'
    run_id: str


@dataclass(frozen=True, slots=True)
class ListRuns(Op):
    """Answer: run rows, in listing order: `(started_at, run_id)` ascending, or descending when
    `newest_first`; only rows that come after `after` in that order; at most `limit` rows.

    The engine checks every filter, the order and `after` again, so a port may answer more rows
    than asked (a filter it cannot apply, or none of them), under one rule: a port that stops at
    `limit` must answer the first `limit` rows in listing order among those its own filters admit.
    A port that cannot keep that order or `after` ignores `limit` and answers every candidate.
    `pick` does all of it over rows held in memory.

    `started_after` / `started_before` bound `started_at` (exclusive); `agent_name` is carried in
    the record body, so most ports leave it to the engine.
    """

    method: ClassVar[str] = 'list_runs'
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    started_after: datetime | None = None
    started_before: datetime | None = None
    after: tuple[datetime, str] | None = None
    """The `(started_at, run_id)` the answer continues after (both aware/exact as stored)."""
    limit: int | None = None
    newest_first: bool = False

    def admits(self, row: RunRow) -> bool:
        """Whether `row` passes the lineage and time filters and comes after `after`."""
        started = sort_time(row.started_at)
        if self.after is not None:
            key = (started, row.run_id)
            if (key >= self.after) if self.newest_first else (key <= self.after):
                return False
        return (
            (self.conversation_id is None or row.conversation_id == self.conversation_id)
            and (self.parent_run_id is None or row.parent_run_id == self.parent_run_id)
            and (self.started_after is None or started > self.started_after)
            and (self.started_before is None or started < self.started_before)
        )

    def pick(self, rows: Iterable[RunRow]) -> list[RunRow]:
        """The answer over rows held in memory: filtered, in listing order, cut at `limit`."""
        found = sorted(
            (r for r in rows if self.admits(r)),
            key=lambda r: (sort_time(r.started_at), r.run_id),
            reverse=self.newest_first,
        )
        return found if self.limit is None else found[: self.limit]


@dataclass(frozen=True, slots=True)
class ListRunIds(Op):
    """Answer: the id of every run the store holds a run row or a snapshot of, each once, in any
    order (a snapshot may be saved for a run that was never registered). Whole-store maintenance,
    such as garbage collection of media, reads it."""

    method: ClassVar[str] = 'list_run_ids'


@dataclass(frozen=True, slots=True)
class CheckIntegrity(Op):
    """Answer: what the backend's own integrity check of the whole store finds wrong (one line per
    problem, empty when it finds nothing), or `None` when the backend has no such check. The
    default answers `None`; SQLite runs `PRAGMA integrity_check`."""

    method: ClassVar[str] = 'check_integrity'


@dataclass(frozen=True, slots=True)
class DeleteRun(Op):
    """Remove everything stored for the run: its row, events, ledger, snapshots, message nodes,
    idempotency keys, counters, and its lease with its start point (where the port keeps leases).
    Answer: whether anything was there."""

    method: ClassVar[str] = 'delete_run'
    writes: ClassVar[bool] = True
    run_id: str


@dataclass(frozen=True, slots=True)
class PutEvents(Op):
    """Append the rows, in order, to the run's events, each with the next `seq` of the run (1, 2,
    ...), skipping a row whose non-`None` idempotency key the run already has, or an earlier row
    of this operation had. No answer."""

    method: ClassVar[str] = 'put_events'
    writes: ClassVar[bool] = True
    run_id: str
    rows: Sequence[EventRow]


@dataclass(frozen=True, slots=True)
class ListEvents(Op):
    """Answer: the run's event rows (with `seq`) in `seq` order; only those with `seq > after_seq`
    when `after_seq` is given; of those, the first `limit` rows, or the last `limit` rows when
    `newest` (still in `seq` order). A port may answer more rows than asked: the engine applies the
    window again."""

    method: ClassVar[str] = 'list_events'
    run_id: str
    after_seq: int | None = None
    limit: int | None = None
    newest: bool = False


@dataclass(frozen=True, slots=True)
class PutEffects(Op):
    """Insert or replace each ledger row on `(run_id, tool_call_id)`, in order (a later row for the
    same call wins). No answer."""

    method: ClassVar[str] = 'put_effects'
    writes: ClassVar[bool] = True
    rows: Sequence[EffectRow]


@dataclass(frozen=True, slots=True)
class ListEffects(Op):
    """Answer: the run's ledger rows, in the order their calls were first recorded; only the one call's row
    when `tool_call_id` is given (a port may answer more: the engine picks it again). A port may also answer
    rows a call's latest one replaced, before it: the engine checks each and keeps the latest, and decides
    from the decoded records which are unresolved (an entry whose status was altered on disk fails its
    checksum). With `count` a port may answer how many calls the rows are of (an `int`), without bodies."""

    method: ClassVar[str] = 'list_effects'
    run_id: str
    tool_call_id: str | None = None
    count: bool = False


@dataclass(frozen=True, slots=True)
class SnapshotKeyApplied(Op):
    """Answer: whether the run has recorded this snapshot idempotency key (kept after pruning)."""

    method: ClassVar[str] = 'snapshot_key_applied'
    run_id: str
    key: str


@dataclass(frozen=True, slots=True)
class NodeExists(Op):
    """Answer: whether the run has a message node with this id."""

    method: ClassVar[str] = 'node_exists'
    run_id: str
    node: int


@dataclass(frozen=True, slots=True)
class SnapshotStates(Op):
    """Answer: `(seq, state)` of each of the run's stored snapshots. With `summary` a port may answer a tuple
    instead: the newest seq, the newest complete one's, how many, how many complete (0 for none)."""

    method: ClassVar[str] = 'snapshot_states'
    run_id: str
    summary: bool = False


@dataclass(frozen=True, slots=True)
class PutSnapshot(Op):
    """Store `bodies` as new message nodes of the run, the first with parent `parent` and each next
    one with the previous as parent; then store `row` with `head` set to the last new node (or to
    `parent` when there are none) and the run's next snapshot `seq`; then record `key` (when not
    `None`) as applied. Answer: the new nodes' ids, in order.

    A node id is never handed out twice for a run id, not even after `delete_run`: another store
    object (or process) may still remember the deleted run's nodes, and the engine's stale check
    only asks whether a node of that id exists.

    Raises `KeyConflict` when `key` was recorded meanwhile by another writer (the engine checked it
    was not, before): a port with transactions may raise it from the operation or when the
    transaction commits, and nothing of the transaction stays.
    Where a port writes in steps (no transactions), the order above is the order of its writes.
    """

    method: ClassVar[str] = 'put_snapshot'
    writes: ClassVar[bool] = True
    run_id: str
    key: str | None
    parent: int | None
    bodies: Sequence[bytes]
    row: SnapshotRow


@dataclass(frozen=True, slots=True)
class DeleteSnapshots(Op):
    """Delete the run's snapshot rows with these seqs (never message nodes or keys). No answer.

    The seqs never include the run's newest snapshot (retention always keeps it: `snapshots_to_prune`),
    so a port may number a new snapshot one past the newest row it holds.
    """

    method: ClassVar[str] = 'delete_snapshots'
    writes: ClassVar[bool] = True
    run_id: str
    seqs: Sequence[int]


@dataclass(frozen=True, slots=True)
class ListSnapshots(Op):
    """Answer: the run's snapshot rows (with `seq`), oldest first; only `complete` ones when
    `complete_only`; only the newest matching one (a list of at most one) when `newest`."""

    method: ClassVar[str] = 'list_snapshots'
    run_id: str
    newest: bool = False
    complete_only: bool = False


@dataclass(frozen=True, slots=True)
class GetNodes(Op):
    """Answer: a mapping `{node id: (parent, body)}` holding at least every node on the chains
    `(head, length)` (a port may answer with more, e.g. all of the run's nodes). A node that is
    missing is simply absent: the engine reports the broken chain."""

    method: ClassVar[str] = 'get_nodes'
    run_id: str
    chains: Sequence[tuple[int, int]] = field(default_factory=tuple[tuple[int, int], ...])


# -- leases: one compare-and-set primitive, its reads, and the fence on writes ----------------


@dataclass(frozen=True, slots=True)
class GetLease(Op):
    """Answer: a `LeaseRead` of the run's lease (`row` is `None` when it has none)."""

    method: ClassVar[str] = 'get_lease'
    run_id: str


@dataclass(frozen=True, slots=True)
class SwapLease(Op):
    """Compare and set the run's lease, atomically against the run's other swaps, `CheckLease` and writes.

    It matches when the run has no lease and `expect` is `None`, or when its lease's epoch is
    `expect` and, with `expired`, its `expires` is earlier than now on the port's clock. Then it
    stores `row` with `expires` set to now plus `ttl` seconds on that clock (`row.expires` is not
    read), and, when `start` is not `None`, `start` as the run's start point (kept as it was
    otherwise). Answer: a `LeaseSwap`: whether it matched, and a `LeaseRead` of the lease after the
    operation (the new one, or the one that did not match), with the port's clock.

    Ports with a clock of their own (a database server) use it for both `expires` and the
    comparison, so the clocks of the processes sharing the store never matter.

    With `expect_expires` (a lease's `expires` exactly as the port read it), the lease must also still
    have that expiry: every swap sets a new one, so nothing swapped it since it was read (a note a
    process adds to a lease it does not own never undoes its owner's change at the same epoch).
    """

    method: ClassVar[str] = 'swap_lease'
    writes: ClassVar[bool] = True
    run_id: str
    expect: int | None
    expired: bool
    row: LeaseRow
    ttl: float
    start: bytes | None = None
    expect_expires: float | None = None

    def matches(self, current: LeaseRow | None, now: float) -> bool:
        """Whether `current` (the stored lease, or `None`) is what the swap expects, at `now`."""
        if current is None or self.expect is None:
            return current is None and self.expect is None
        if self.expect_expires is not None and current.expires != self.expect_expires:
            return False
        return current.epoch == self.expect and (not self.expired or current.expires < now)

    def stored(self, now: float) -> LeaseRow:
        """The row to store when the swap matches at `now`."""
        row = self.row
        return LeaseRow(row.run_id, row.epoch, row.state, row.host, now + self.ttl, row.body)


@dataclass(frozen=True, slots=True)
class ListLeases(Op):
    """Answer: `(rows, now)`: the leases in one of `states` (never `ended`), each once, in any order,
    and the port's clock. Read through an index on the state: never a scan of every run."""

    method: ClassVar[str] = 'list_leases'
    states: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GetLeaseStart(Op):
    """Answer: the start point stored with the run's lease (`SwapLease.start`), or `None`."""

    method: ClassVar[str] = 'get_lease_start'
    run_id: str


@dataclass(frozen=True, slots=True)
class SnapshotWrite:
    """A snapshot to store with a step: its new messages (encoded, in stored form, sealed), the node
    they hang off (`None`: the history's start) and its row; `key` is its idempotency key."""

    key: str | None
    parent: int | None
    bodies: Sequence[bytes]
    row: SnapshotRow


@dataclass(frozen=True, slots=True)
class WriteStep(Op):
    """Everything one step boundary of a run writes, in one transaction, in this order (each part
    is the operation of that name):

    1. with `epoch`, `CheckLease(run_id, epoch)`: raise `Fenced` and store nothing when the run's
       lease is at another epoch;
    2. with `snapshot`: when its key is recorded already, the snapshot is skipped (the answer is
       `None`); else when its `parent` is not a node of the run, raise
       `stepcore.engine._plans.StaleHistory` (nothing stays); else `PutSnapshot`, then, with
       `max_snapshots`, `DeleteSnapshots` of what `stepcore.store.retention.snapshots_to_prune`
       names among the run's snapshots and the new one;
    3. `PutEffects(effects)`, then `PutEvents(run_id, events)` (each skipped when empty).

    Answer: the snapshot's new node ids, or `None` when no snapshot was written.

    Only a port with `fused_steps` is sent this operation; the engine runs the steps above one
    operation at a time (`stepcore.engine._plans.write_plan`) on every other port.
    """

    method: ClassVar[str] = 'write_step'
    writes: ClassVar[bool] = True
    run_id: str
    events: Sequence[EventRow]
    effects: Sequence[EffectRow]
    snapshot: SnapshotWrite | None
    max_snapshots: int | None
    epoch: int | None = None


@dataclass(frozen=True, slots=True)
class CheckLease(Op):
    """Inside a write transaction, before its writes: the transaction must take effect only while the
    run's lease epoch is `epoch`. When it is not (another owner took the run, or it has no lease),
    raise `stepcore.engine._plans.Fenced` and store nothing of the transaction, either here or at
    commit (a port that sends its writes at commit checks there). No answer.

    Atomic against `SwapLease`: a takeover committed before this transaction commits fences it; one
    after it sees everything it wrote.
    """

    method: ClassVar[str] = 'check_lease'
    run_id: str
    epoch: int


# -- the store itself ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreIdentity(Op):
    """Answer: the id the store keeps for itself: the one it holds, or, when it holds none yet (a
    store made by an earlier release, or not written to yet), `new_id`, stored now and answered.

    Atomic: of several first asks at once, in this process or others, exactly one stores its id and
    every one answers that id. The id is kept with the store's data, so a copy of the data carries
    it too; it is never changed or removed afterwards (`DeleteRun` leaves it). The engine asks it
    only when a caller wants to know which store it has (`EngineStore.store_identity`), never on a
    run's writes.
    """

    method: ClassVar[str] = 'store_identity'
    writes: ClassVar[bool] = True
    new_id: str
    """A fresh id (a uuid4 in hex) the engine made, stored when the store holds none."""


@dataclass(frozen=True, slots=True)
class StoreLocation(Op):
    """Answer: where the store's data lives, as text naming it for a person (no password), and the
    same for every store object on the same data: a file's or folder's real path (links resolved), a
    database's name, a key or table prefix. Two stores with one `StoreIdentity` whose locations
    differ hold copies of one store's data (a copied file, a restored dump).

    The default is the port's `describe()`; a port whose `describe()` names the place as it was
    given (a relative path, a shared connection) answers it exactly instead.
    """

    method: ClassVar[str] = 'store_location'
