"""Whole-store maintenance: the store's identity and place, its checks, and what a run holds.

What `stepcore check`, `gc`, `prune` and `rekey` ask of a store: the backend's integrity check,
whether a run's records are counted, the media and encryption keys a run's stored bodies
reference (read without decoding a message), and a run's footprint, weighed and removed in one
transaction.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import cast

from stepcore.common.damage import DamagedRecordError, decoded
from stepcore.common.features import LEASES
from stepcore.engine._history import walk_chain
from stepcore.engine._ops import (
    Body,
    CheckIntegrity,
    DeleteRun,
    EffectRow,
    EventRow,
    GetLease,
    GetRun,
    LeaseRead,
    ListEffects,
    ListEvents,
    ListSnapshots,
    Node,
    RunRow,
    SnapshotRow,
    StoreIdentity,
    StoreLocation,
)
from stepcore.engine._plans import Plan, read_snapshots
from stepcore.engine._seal import MessageDamage, key_id_of
from stepcore.engine._store_base import EngineBase
from stepcore.engine._tally import tally_of
from stepcore.media.walker import stored_references
from stepcore.store.lifecycle import RunFootprint, run_status, sort_time
from stepcore.store.models import StepEvent

__all__ = ('StoreUpkeep',)


class StoreUpkeep(EngineBase):
    """`EngineStore`'s maintenance of the whole store and of a run's footprint."""

    async def _prune_run(self, run_id: str, cutoff: datetime, *, dry_run: bool) -> RunFootprint | None:
        """Weigh the run and remove it in one transaction (where the backend has them), so a write
        to the run cannot slip in between the check and the delete."""
        run_id = self._engine_run_id(run_id)

        def plan() -> Plan[RunFootprint | None]:
            footprint = yield from self.__footprint_plan(run_id)
            if footprint is None or dry_run or footprint.last_activity >= cutoff:
                return footprint
            return footprint if (yield DeleteRun(run_id)) else None

        if dry_run:
            return await self._engine_driver.read(run_id, plan)
        try:
            return cast(RunFootprint | None, await self._engine_driver.transact([run_id], plan))
        finally:
            self._engine_history.forget(run_id)

    async def _run_footprint(self, run_id: str) -> RunFootprint | None:
        run_id = self._engine_run_id(run_id)
        return await self._engine_driver.read(run_id, lambda: self.__footprint_plan(run_id))

    def __footprint_plan(self, run_id: str) -> Plan[RunFootprint | None]:
        """Counts and last activity of a run from its rows; snapshot headers only, no messages.
        A damaged record is counted, and leaves its time out of the last activity."""
        answers = yield (GetRun(run_id), ListEvents(run_id), ListEffects(run_id), ListSnapshots(run_id))
        run_row, event_rows, effect_rows, snapshot_rows = cast(
            tuple[RunRow | None, Sequence[EventRow], Sequence[EffectRow], Sequence[SnapshotRow]], tuple(answers)
        )
        if run_row is None:
            return None
        times = [sort_time(run_row.started_at)]
        events: list[StepEvent] = []
        for row in event_rows:
            with contextlib.suppress(DamagedRecordError):
                events.append(self._engine_rows.decode_event(row))
        times.extend(sort_time(e.timestamp) for e in events)
        for row in effect_rows:
            with contextlib.suppress(DamagedRecordError):
                entry = self._engine_rows.decode_effect(row)
                times.append(sort_time(entry.updated_at or entry.started_at))
        for row in snapshot_rows:
            with contextlib.suppress(DamagedRecordError):
                times.append(sort_time(self._engine_rows.decode_snapshot_header(row).timestamp))
        return RunFootprint(
            run_id=run_id,
            events=len(event_rows),
            snapshots=len(snapshot_rows),
            ledger_entries=len(effect_rows),
            last_activity=max(times),
            status=run_status(events),
        )

    # -- the store itself -----------------------------------------------------------------------

    async def store_identity(self) -> str:
        """The store's id: a uuid4 in hex, kept with the store's data from its first use on (a store
        made by an earlier release gets one when first asked).

        Every store object, in any process, that opens the same data answers the same id, and two
        processes asking a fresh store at once get one id; another store (another file, prefix or
        database) has another. A copy of the data (a copied file, a restored dump) carries the id
        with it: `store_location()` tells a copy from the original, and
        `stepcore.store.same_store.same_store` compares both. Asking may write the id, once; it is
        never read on a run's writes.
        """
        return cast(str, await self._engine_driver.write_op((), StoreIdentity(uuid.uuid4().hex)))

    async def store_location(self) -> str:
        """Where the store's data lives, naming it for a person without a password: the real path of
        a database file or folder, a database's name, a key or table prefix (see `ops.StoreLocation`).
        The same for every store object on the same data."""
        return cast(str, await self._engine_driver.read_op(None, StoreLocation()))

    # -- whole-store maintenance --------------------------------------------------------------

    async def check_integrity(self) -> list[str] | None:
        """What the backend's own integrity check finds wrong in the whole store (empty: nothing),
        `None` when the backend has none (see `stepcore.check_store`)."""
        found = await self._engine_driver.read_op(None, CheckIntegrity())
        return None if found is None else list(cast(Sequence[str], found))

    async def counts_records(self, run_id: str) -> bool | None:
        """Whether the run's lease holds a count of its records that checks (`stepcore.engine._tally`):
        runs written without a lease, or by a release before counts, have none."""
        run_id = self._engine_run_id(run_id)
        if LEASES not in type(self).features:
            return False
        with contextlib.suppress(Exception):
            read = cast(LeaseRead, await self._engine_driver.read_op(run_id, GetLease(run_id)))
            return tally_of(run_id, read, self._engine_where()) is not None
        return False

    async def media_references(self, run_id: str) -> set[str]:
        """The `media+sha256://` URIs that the run's snapshots (complete and interrupted) reference.

        Read from the stored messages, without fetching a blob. Unlike `list_snapshots`, a snapshot
        that cannot be read is not skipped: `DamagedRecordError` names it, since leaving its
        references out would let its media be collected.
        """
        run_id = self._engine_run_id(run_id)
        rows, nodes = await self._engine_driver.read(
            run_id, partial(read_snapshots, run_id, newest=False, complete_only=False)
        )
        found: set[str] = set()
        for row in rows:
            # Each chain is opened as a read opens it (checksums checked, bodies decrypted), so a
            # damaged message stops the collection rather than hiding its references.
            _, head_sum, sealed = self._engine_rows.snapshot_header(row)

            def lookup(node: object) -> Node:
                entry = nodes.get(cast(int, node))
                if entry is None:
                    raise LookupError(f'message node {node} is missing')
                return entry

            def references(row: SnapshotRow = row, head_sum: str | None = head_sum, sealed: bool = sealed) -> set[str]:
                stored = walk_chain(row.head, row.length, lookup)
                try:
                    bodies = self._engine_sealer.open_nodes(row.run_id, stored, head_sum, sealed=sealed)
                except MessageDamage as error:
                    raise ValueError(f'message {error.position} is damaged: {error.reason}') from error
                refs: set[str] = set()
                for body in bodies:
                    refs |= stored_references(body)
                return refs

            found |= decoded(references, run_id=run_id, record=f'snapshot seq={row.seq}', where=self._engine_where())
        if LEASES in type(self).features:
            found |= await self.__start_references(run_id)
        return found

    async def __start_references(self, run_id: str) -> set[str]:
        """The media the run's start point references (a restart reads them)."""
        refs: set[str] = set()
        for body in await self._engine_start(run_id) or ():
            refs |= stored_references(body)
        return refs

    # -- keys ---------------------------------------------------------------------------------

    async def stored_key_ids(self, run_id: str) -> set[str | None]:
        """The encryption key ids the run's stored bodies were written with (`None`: in clear).

        Covers the run record, events, ledger, snapshot headers and the messages of stored
        snapshots; a body that does not parse counts as `None`. `stepcore rekey` uses it to find
        the runs still to re-encrypt.
        """
        run_id = self._engine_run_id(run_id)

        def plan() -> Plan[list[Body]]:
            run = cast(RunRow | None, (yield GetRun(run_id)))
            events = cast(Sequence[EventRow], (yield ListEvents(run_id)))
            effects = cast(Sequence[EffectRow], (yield ListEffects(run_id)))
            rows, nodes = yield from read_snapshots(run_id, newest=False, complete_only=False)
            bodies: list[Body] = [] if run is None else [run.body]
            bodies += [r.body for r in (*events, *effects, *rows)]
            bodies += [body for _, body in nodes.values()]
            return bodies

        return {key_id_of(body) for body in await self._engine_driver.read(run_id, plan)}
