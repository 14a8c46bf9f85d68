"""A run's tally: how many records it must have, kept with its lease, so a short listing is caught.

Per-record checksums prove that each record read back is the one written; they cannot prove that
none is missing. A damaged index (a flipped key byte in a b-tree, a record header's serial type)
can make a listing stop early and return the first records of a run, each intact. So every time
the engine swaps a run's lease (claiming, renewing, releasing it) it counts what the run holds and
stores the count, sealed, in the lease's body:

- `events`: the newest event's seq (seqs run 1, 2, ... without gaps, and events are never removed);
- `effects`: how many ledger entries (entries are replaced, never removed);
- `snapshot` / `complete`: the newest snapshot's seq, and the newest complete one's (retention
  never removes the newest).

Records only ever grow, and the count is read before the swap, so the tally is a lower bound of
what the run holds at any later time. A read of the run's records reads the lease first, in the
same read transaction where the port has one, and a listing that comes back with less than the
tally (or, for events, with a seq missing in the middle) raises `DamagedRecordError` naming the
run. A tally that does not check is logged and not used. Runs without a lease (written through
the store's API directly, or before tallies existed) are read as before: their tails cannot be
checked, and `stepcore check` says so.

The tally is a field of the lease body (`"tally"`), which readers of an older release ignore.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from stepcore.common.damage import DamagedRecordError
from stepcore.engine._ops import EffectRow, EventRow, GetLease, LeaseRead, ListEffects, ListEvents, SnapshotStates
from stepcore.engine._plans import Plan
from stepcore.store.models import SnapshotState

__all__ = (
    'TALLY_KEY',
    'Tally',
    'check_ascending',
    'count_plan',
    'leased_plan',
    'tally_of',
    'tally_unknown',
    'with_tally',
)

T = TypeVar('T')
logger = logging.getLogger('stepcore.engine')

TALLY_KEY: Final = 'tally'
_COMPLETE: Final = SnapshotState.COMPLETE.value


@dataclass(frozen=True, slots=True)
class Tally:
    """What a run held when its lease was last swapped (see the module docstring)."""

    events: int
    effects: int
    snapshot: int
    complete: int
    snapshots: int = 0
    """How many snapshots the run held (complete or not)."""
    completes: int = 0
    """How many complete snapshots the run held."""

    def seal(self, run_id: str) -> dict[str, Any]:
        """The tally as stored in a lease body, with its checksum over the run id and the counts."""
        counts = {
            'e': self.events,
            'l': self.effects,
            's': self.snapshot,
            'k': self.complete,
            'n': self.snapshots,
            'm': self.completes,
        }
        return {**counts, 'c': _sum(run_id, counts)}

    def short_events(
        self, run_id: str, seqs: Sequence[int], after: int, *, to_end: bool, gapless: bool, where: str
    ) -> None:
        """Raise when the event seqs a listing found (after `after`, in order; `to_end`: the listing
        was meant to reach the newest) skip one (`gapless`: the port never leaves a gap), or stop
        short of the tally."""
        expected = after + 1
        for seq in seqs:
            if gapless and seq != expected:
                raise _missing(run_id, 'events', where, f'event seq {expected} is missing (the next found is {seq})')
            expected = seq + 1
        if to_end and expected - 1 < self.events:
            found = f'up to seq {expected - 1}' if seqs else 'none'
            raise _missing(run_id, 'events', where, f'the run had {self.events} events and the store lists {found}')

    def short_effects(self, run_id: str, found: int, where: str) -> None:
        """Raise when a full listing of the ledger holds fewer entries than the tally."""
        if found < self.effects:
            raise _missing(
                run_id, 'ledger', where, f'the run had {self.effects} ledger entries and the store lists {found}'
            )

    def short_snapshots(
        self, run_id: str, seqs: Sequence[int], *, newest_only: bool, complete_only: bool, where: str
    ) -> None:
        """Raise when the snapshot seqs a listing found end before the tally's newest or, when no
        snapshot was saved since the tally (so retention removed none since), number fewer than it."""
        wanted = self.complete if complete_only else self.snapshot
        newest = max(seqs, default=None)
        if wanted and (newest is None or newest < wanted):
            found = 'none' if newest is None else f'seq {newest}'
            raise _missing(
                run_id, 'snapshots', where, f'the run had a snapshot of seq {wanted} and the newest found is {found}'
            )
        # Only a listing of every snapshot can tell: its newest unchanged means no save since, and
        # so no pruning since (an interrupted save may prune a complete snapshot).
        if not (newest_only or complete_only) and newest == wanted and len(seqs) < self.snapshots:
            raise _missing(
                run_id, 'snapshots', where, f'the run had {self.snapshots} snapshots and the store lists {len(seqs)}'
            )

    @property
    def has_records(self) -> bool:
        return bool(self.events or self.effects or self.snapshot)


def _sum(run_id: str, counts: Mapping[str, int]) -> str:
    text = run_id + '\x1f' + '\x1f'.join(f'{k}={counts[k]}' for k in sorted(counts))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def check_ascending(run_id: str, record: str, seqs: Sequence[int], where: str) -> None:
    """Raise when a listing's seqs, which a port answers oldest first, repeat or go back: a damaged
    index of the store hands out a row twice, or another row in its place, and a count alone would
    not notice (the listing is as long as it should be)."""
    previous = 0
    for seq in seqs:
        if seq <= previous:
            how = f'seq {seq} is listed twice' if seq == previous else f'seq {seq} is listed after seq {previous}'
            raise DamagedRecordError(
                run_id=run_id, record=record, where=where, reason=f'the listing is out of order: {how}'
            )
        previous = seq


def _missing(run_id: str, record: str, where: str, reason: str) -> DamagedRecordError:
    return DamagedRecordError(run_id=run_id, record=record, where=where, reason=f'records are missing: {reason}')


def with_tally(body: str, run_id: str, tally: Tally) -> str:
    """A lease body (compact JSON object, from `encode_lease_body`) with the run's tally in it."""
    sealed = json.dumps({TALLY_KEY: tally.seal(run_id)}, separators=(',', ':'))
    return sealed if body == '{}' else body[:-1] + ',' + sealed[1:]


def tally_of(run_id: str, read: LeaseRead | None, where: str) -> Tally | None:
    """The tally in a lease as a port read it; `None` when there is none, or when it does not check
    (logged: the run's tail is then not checked)."""
    row = read.row if read is not None else None
    if row is None:
        return None
    try:
        data: Any = row.body if isinstance(row.body, Mapping) else json.loads(row.body)
        stored = cast(dict[str, Any], data).get(TALLY_KEY) if isinstance(data, dict) else None
        if stored is None:
            return None
        if not isinstance(stored, dict):
            raise ValueError(f'the tally is {type(stored).__name__}, not an object')
        fields = cast(dict[str, Any], stored)
        counts = {k: fields.get(k) for k in ('e', 'l', 's', 'k', 'n', 'm')}
        if not all(type(v) is int and v >= 0 for v in counts.values()):
            raise ValueError(f'the tally holds counts that are not whole numbers: {counts}')
        ints = cast(dict[str, int], counts)
        if fields.get('c') != _sum(run_id, ints):
            raise ValueError('the tally fails its checksum')
        return Tally(ints['e'], ints['l'], ints['s'], ints['k'], ints['n'], ints['m'])
    except (ValueError, TypeError, UnicodeError) as error:
        tally_unknown(run_id, where, f'its count of records is damaged ({error})')
        return None


def tally_unknown(run_id: str, where: str, why: str) -> None:
    """Log that a read of the run cannot tell whether records are missing, and why."""
    logger.warning('records missing from run %r in %s cannot be told: %s', run_id, where, why)


def count_plan(run_id: str) -> Plan[Tally]:
    """Count what the run holds now (three reads sent together)."""
    events, effects, states = yield (
        ListEvents(run_id, limit=1, newest=True),
        ListEffects(run_id, count=True),
        SnapshotStates(run_id, summary=True),
    )
    return _tally(cast(Sequence[EventRow], events), effects, states)


def _tally(event_rows: Sequence[EventRow], effects: object, states: object) -> Tally:
    """The counts from the reads above. `effects` is the ledger's rows, or their number of calls, and
    `states` the snapshots' `(seq, state)` pairs, or their summary, where the port counts them itself:
    so a long run's renewal does not read a row per record it holds."""
    calls = effects if type(effects) is int else len({row.tool_call_id for row in cast(Sequence[EffectRow], effects)})
    if type(states) is tuple:
        newest, complete, snapshots, completes = cast(tuple[int, int, int, int], states)
    else:
        pairs = cast(Sequence[tuple[int, str]], states)
        newest = max((seq for seq, _ in pairs), default=0)
        complete = max((seq for seq, state in pairs if state == _COMPLETE), default=0)
        snapshots, completes = len(pairs), sum(1 for _, state in pairs if state == _COMPLETE)
    return Tally(
        events=max((row.seq or 0 for row in event_rows), default=0),
        effects=calls,
        snapshot=newest,
        complete=complete,
        snapshots=snapshots,
        completes=completes,
    )


def swap_plan(run_id: str) -> Plan[tuple[Tally, LeaseRead]]:
    """What a lease swap reads first, in one go: the run's tally (`count_plan`) and its lease."""
    events, effects, states, lease = yield (
        ListEvents(run_id, limit=1, newest=True),
        ListEffects(run_id, count=True),
        SnapshotStates(run_id, summary=True),
        GetLease(run_id),
    )
    tally = _tally(cast(Sequence[EventRow], events), effects, states)
    return tally, cast(LeaseRead, lease)


def leased_plan(run_id: str, plan: Plan[T]) -> Plan[tuple[T, LeaseRead]]:
    """`plan`, with the run's lease read first (its tally is then a lower bound of what `plan` reads)."""
    lease = cast(LeaseRead, (yield GetLease(run_id)))
    result = yield from plan
    return result, lease
