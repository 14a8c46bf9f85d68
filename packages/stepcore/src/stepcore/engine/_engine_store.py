"""`EngineStore`: every `StepStore` method, written once over a backend's port.

The engine owns the mechanisms: encoding records into rows and back, run-id checks and
registration rules, idempotency keys, incremental snapshots (which messages are new, the stale
check, retention), the order of writes (the crash rule), damage handling and error wrapping. A
backend subclasses `EngineStore` and passes its port (`stepcore.engine._port`), which only does I/O.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import Any, ClassVar, Final, TypeVar, cast

from pydantic_ai.messages import ModelMessage

from stepcore.common.damage import DamagedRecordError, decoded, skip_damaged
from stepcore.common.encryption import Encryption
from stepcore.common.features import (
    ENCRYPTION,
    ENGINE_PORT,
    LEASES,
    MEDIA_EXTERNALIZATION,
    SNAPSHOT_RETENTION,
    require_feature,
)
from stepcore.common.telemetry import fenced_write
from stepcore.engine._driver import INLINE_NEW_MESSAGES, INLINE_RECORDS, Driver, NeedsWalk, single
from stepcore.engine._history import HistoryDelta, HistoryIndex, walk_chain
from stepcore.engine._ops import (
    Body,
    CheckIntegrity,
    DeleteRun,
    EffectRow,
    EventRow,
    GetLease,
    GetLeaseStart,
    GetRun,
    InsertRun,
    LeaseRead,
    LeaseRow,
    LeaseSwap,
    ListEffects,
    ListEvents,
    ListLeases,
    ListRunIds,
    ListRuns,
    ListSnapshots,
    Node,
    RunRow,
    SnapshotRow,
    SnapshotWrite,
    StoreIdentity,
    StoreLocation,
    SwapLease,
    WriteStep,
)
from stepcore.engine._plans import (
    Fenced,
    KeyConflict,
    Plan,
    StaleHistory,
    read_snapshot,
    read_snapshots,
)
from stepcore.engine._port import Port, check_text
from stepcore.engine._rows import (
    SNAPSHOT_CLEAR,
    SNAPSHOT_FIELDS_IN_ROW,
    RowCodec,
    record_rows,
)
from stepcore.engine._seal import HEAD_KEY, NO_PREV, MessageDamage, Sealer, key_id_of
from stepcore.engine._tally import (
    Tally,
    check_ascending,
    leased_plan,
    swap_plan,
    tally_of,
    tally_unknown,
    with_tally,
)
from stepcore.media.encrypting import EncryptingMediaStore
from stepcore.media.protocol import MediaStore, MediaStoreOption, check_media_store, resolve_media_store
from stepcore.media.walker import DEFAULT_MEDIA_THRESHOLD_BYTES, MediaWalker, stored_references
from stepcore.store.arguments import (
    check_event_window,
    check_message_window,
    check_seq,
    check_writes,
    event_window,
    shared_prefix,
)
from stepcore.store.codec import decode_messages, encode_message
from stepcore.store.leases import (
    Change,
    Lease,
    LeaseState,
    RunFencedError,
    decode_lease_body,
    encode_lease_body,
    fence_of,
    with_refusal,
)
from stepcore.store.lifecycle import RunFootprint, RunKey, RunQuery, RunStatus, collect_runs, run_status, sort_time
from stepcore.store.models import (
    ContinuableSnapshot,
    RunRecord,
    SnapshotMessages,
    SnapshotState,
    SnapshotSummary,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.store.protocols import StepWrite
from stepcore.store.registration import check_registration
from stepcore.store.retention import check_max_snapshots
from stepcore.store.step_store import StepStore

__all__ = ('EngineStore',)


_KEY_CONFLICT_ATTEMPTS = 5
T = TypeVar('T')

_MAX_TTL: Final = 10.0 * 365 * 24 * 3600
"""The longest lease a swap takes: ten years (longer ones overflow some clocks)."""
_STARTED: Final = ToolEffectStatus.STARTED.value

_NOTE_ATTEMPTS: Final = 3
_NOT_THE_STORE: Final = (ValueError, TypeError, LookupError, KeyConflict, StaleHistory, DamagedRecordError)
"""Errors of a write that say what is wrong with it, not with the store."""


def _keep_refusals(lease: Lease, stored: Lease | None) -> Lease:
    """`lease` (about to replace `stored`, at the same epoch) with the refused writes noted in
    `stored` that it does not hold (noted after its caller read the lease)."""
    if stored is None:
        return lease
    missing = [c for c in stored.history if c.what is Change.REFUSED and c not in lease.history]
    if not missing:
        return lease
    merged = sorted((*lease.history, *missing), key=lambda change: change.at)
    return replace(lease, history=tuple(merged))


def _replace_history(body: str | bytes | Mapping[str, Any], lease: Lease) -> str:
    """A stored lease body with its history replaced by `lease`'s, everything else (the tally
    included) as stored."""
    data = dict(body) if isinstance(body, Mapping) else cast(dict[str, Any], json.loads(body))
    data['history'] = [change.to_json() for change in lease.history]
    return json.dumps(data, separators=(',', ':'))


@dataclass(slots=True)
class _Save:
    """A snapshot save in progress: its messages and, once found, what is new in them."""

    messages: list[ModelMessage]
    delta: HistoryDelta | None = None
    sums: list[str] | None = None
    """The stored sums of the delta's new messages, once sealed."""
    step: WriteStep | None = None
    """The step last planned: what was written, once the save returns."""


class EngineStore(StepStore):
    """A `StepStore` over a port: subclass it, build your port, and call `super().__init__(port, ...)`.

    `max_snapshots_per_run` needs the feature `snapshot_retention` and `media_store` /
    `media_threshold_bytes` the feature `media_externalization` to be declared in `features`: an
    undeclared one is refused with `NotImplementedError`. `media_store` takes a media store, `None`
    or `'auto'`, which here means none: a store with a default media store of its own resolves
    `'auto'` to it (`stepcore.media.resolve_media_store`) before calling this.

    Its own state and helpers are name-mangled (`self.__driver`), and a backend's store keeps
    its own the same way: users subclass stores and set private attributes of their own, which
    must never replace the store's (docs/engine.md, "The store's own state").
    """

    features: ClassVar[frozenset[str]] = frozenset({ENGINE_PORT})
    implied_features: ClassVar[frozenset[str]] = frozenset({ENGINE_PORT})

    def __init__(
        self,
        port: Port,
        *,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStoreOption = None,
        media_threshold_bytes: int | None = None,
        history_runs: int = 256,
        encryption: Encryption | None = None,
        default_media_store: Callable[[], MediaStore | None] | None = None,
    ) -> None:
        """`media_store` is the option as a user gave it: `'auto'` is `default_media_store()` (the
        backend's own media store, made only then; no media store when the backend has none), `None`
        is none, a media store is used as it is."""
        driver = Driver(port, type(self).__name__)
        media_store = resolve_media_store(
            media_store, default=default_media_store or (lambda: None), owner=type(self).__name__
        )
        if max_snapshots_per_run is not None:
            require_feature(self, SNAPSHOT_RETENTION, option='max_snapshots_per_run')
        if media_store is not None or media_threshold_bytes is not None:
            require_feature(self, MEDIA_EXTERNALIZATION, option='media_store / media_threshold_bytes')
        if encryption is not None:
            require_feature(self, ENCRYPTION, option='encryption')
        if encryption is not None and not isinstance(encryption, Encryption):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f'encryption= takes a stepcore.Encryption, got {type(encryption).__name__}')
        self.encryption: Encryption | None = encryption
        self.__sealer = Sealer(encryption)
        self.__rows = RowCodec(self.__sealer, self.__where)
        self.__driver = driver
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        self.media_store: MediaStore | None = media_store
        threshold = DEFAULT_MEDIA_THRESHOLD_BYTES if media_threshold_bytes is None else media_threshold_bytes
        blobs: Any = media_store
        if encryption is not None and media_store is not None:
            blobs = EncryptingMediaStore(media_store, encryption)
        self.__history = HistoryIndex(MediaWalker(blobs, threshold), max_runs=history_runs)

    @classmethod
    def check_options(
        cls,
        *,
        max_snapshots_per_run: object = None,
        media_store: object = None,
        media_threshold_bytes: object = None,
    ) -> None:
        """Refuse a bad engine option with the error `__init__` would raise, before a backend opens
        anything it would then have to close (a client, a connection pool)."""
        check_max_snapshots(cast(int | None, max_snapshots_per_run))
        MediaWalker(None, cast(int | None, media_threshold_bytes))
        check_media_store(media_store, owner=cls.__name__)

    @property
    def port(self) -> Port:
        """The port the store's I/O goes to (setting it runs the store on another port)."""
        return self.__driver.port

    @port.setter
    def port(self, port: Port) -> None:
        self.__driver = Driver(port, type(self).__name__)

    def __repr__(self) -> str:
        return f'<{type(self).__name__} on {self.__driver.port.describe()}>'

    def is_transient(self, error: BaseException) -> bool:
        """Whether `error`, raised by this store, is a passing failure (a timeout, a lost connection,
        a lock another session holds, a conflict): the same call a little later may succeed. The
        store already made it again for a while before raising it."""
        return isinstance(error, Exception) and self.__driver.port.transient(error, write=False)

    # -- checks ---------------------------------------------------------------------------------

    def __run_id(self, run_id: object) -> str:
        return self.__driver.port.check_run_id(run_id)

    def __where(self) -> str:
        return self.__driver.port.describe()

    # -- runs ---------------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        run_id = self.__run_id(record.run_id)
        for value, what in ((record.conversation_id, 'conversation_id'), (record.parent_run_id, 'parent_run_id')):
            if value is not None:
                check_text(value, what)
        row = self.__rows.run_row(record, run_id)
        existing = cast(RunRow | None, await self.__driver.write_op([run_id], InsertRun(row)))
        if existing is not None:
            check_registration(self.__rows.decode_run(existing), record)

    async def get_run(self, run_id: str) -> RunRecord | None:
        run_id = self.__run_id(run_id)
        answer, tally = await self.__read_counted(run_id, lambda: single(GetRun(run_id)))
        row = cast(RunRow | None, answer)
        if row is None and tally is not None and tally.has_records:
            raise DamagedRecordError(
                run_id=run_id,
                record='run',
                where=self.__where(),
                reason='records are missing: the run has records and a lease, and its run record is not found',
            )
        return self.__rows.decode_run(row) if row is not None else None

    async def list_runs(
        self,
        *,
        conversation_id: str | None = None,
        parent_run_id: str | None = None,
        agent_name: str | None = None,
        status: RunStatus | None = None,
        started_after: datetime | None = None,
        started_before: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        newest_first: bool = False,
    ) -> list[RunRecord]:
        query = RunQuery.make(
            conversation_id=conversation_id,
            parent_run_id=parent_run_id,
            agent_name=agent_name,
            status=status,
            started_after=started_after,
            started_before=started_before,
            limit=limit,
            cursor=cursor,
            newest_first=newest_first,
        )

        async def fetch(after: RunKey | None, batch: int | None) -> tuple[list[RunRecord], bool, RunKey | None]:
            op = ListRuns(
                conversation_id=query.conversation_id,
                parent_run_id=query.parent_run_id,
                agent_name=query.agent_name,
                started_after=query.started_after,
                started_before=query.started_before,
                after=after,
                limit=batch,
                newest_first=query.newest_first,
            )
            rows = cast(Sequence[RunRow], await self.__driver.read_op(None, op))
            found: list[RunRecord] = []
            for row in rows:
                try:
                    found.append(self.__rows.decode_run(row))
                except DamagedRecordError as error:
                    skip_damaged(error)
            keys = [(sort_time(row.started_at), row.run_id) for row in rows]
            last = (min(keys) if query.newest_first else max(keys)) if keys else None
            return found, batch is None or len(rows) != batch, last

        return await collect_runs(query, fetch, self._status_of)

    async def delete_run(self, run_id: str) -> bool:
        run_id = self.__run_id(run_id)
        try:
            return bool(await self.__driver.write_op([run_id], DeleteRun(run_id)))
        finally:
            self.__history.forget(run_id)

    async def _prune_run(self, run_id: str, cutoff: datetime, *, dry_run: bool) -> RunFootprint | None:
        """Weigh the run and remove it in one transaction (where the backend has them), so a write
        to the run cannot slip in between the check and the delete."""
        run_id = self.__run_id(run_id)

        def plan() -> Plan[RunFootprint | None]:
            footprint = yield from self.__footprint_plan(run_id)
            if footprint is None or dry_run or footprint.last_activity >= cutoff:
                return footprint
            return footprint if (yield DeleteRun(run_id)) else None

        if dry_run:
            return await self.__driver.read(run_id, plan)
        try:
            return cast(RunFootprint | None, await self.__driver.transact([run_id], plan))
        finally:
            self.__history.forget(run_id)

    async def _run_footprint(self, run_id: str) -> RunFootprint | None:
        run_id = self.__run_id(run_id)
        return await self.__driver.read(run_id, lambda: self.__footprint_plan(run_id))

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
                events.append(self.__rows.decode_event(row))
        times.extend(sort_time(e.timestamp) for e in events)
        for row in effect_rows:
            with contextlib.suppress(DamagedRecordError):
                entry = self.__rows.decode_effect(row)
                times.append(sort_time(entry.updated_at or entry.started_at))
        for row in snapshot_rows:
            with contextlib.suppress(DamagedRecordError):
                times.append(sort_time(self.__rows.decode_snapshot_header(row).timestamp))
        return RunFootprint(
            run_id=run_id,
            events=len(event_rows),
            snapshots=len(snapshot_rows),
            ledger_entries=len(effect_rows),
            last_activity=max(times),
            status=run_status(events),
        )

    # -- writes -------------------------------------------------------------------------------

    async def append_event(self, event: StepEvent) -> None:
        await self.__write_all([event], None)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self.__write_all([record], None)

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self.__write_all((), snapshot)

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        """Save `snapshot` and apply `writes`, per run in one transaction (see `StepStore.write_batch`).

        Every record is checked before anything is written.
        """
        await self.__write_all(writes, snapshot)

    async def __write_all(self, writes: Sequence[StepWrite], snapshot: ContinuableSnapshot | None) -> None:
        """Check every record (before anything is written), then write each run's share in one transaction.

        Records are encoded inside the plan: on a `SyncPort`'s thread, beside the rest of the write.
        """
        by_run: dict[str, list[StepWrite]] = {}
        given: object = object()  # no run id is this object
        run_id = ''
        for write in check_writes(writes):
            if isinstance(write, StepEvent):
                if write.idempotency_key is not None:
                    check_text(write.idempotency_key, 'idempotency_key')
            else:
                check_text(write.tool_call_id, 'tool_call_id')
            if write.run_id is not given:  # a batch's records share their run id: checked once
                given = write.run_id
                run_id = self.__run_id(given)
            by_run.setdefault(run_id, []).append(write)
        if snapshot is not None:
            run_id = self.__run_id(snapshot.run_id)
            if snapshot.idempotency_key is not None:
                check_text(snapshot.idempotency_key, 'idempotency_key')
            await self.__write_run(run_id, by_run.pop(run_id, []), snapshot)
        for run_id, records in by_run.items():
            await self.__write_run(run_id, records, None)

    async def write_step(
        self, run_id: str, records: Sequence[StepWrite], snapshot: ContinuableSnapshot | None = None
    ) -> WriteStep:
        """Save one run's `snapshot` and `records` in one transaction, as `write_batch` does, for a
        caller that built them itself for `run_id` (the capability's writer): nothing is checked
        again. Every other caller goes through `write_batch`, which checks what it is given.
        Answers the step as written (sealed): `sealed_size` tells its bytes."""
        return await self.__write_run(run_id, records, snapshot)

    async def __write_run(
        self, run_id: str, records: Sequence[StepWrite], snapshot: ContinuableSnapshot | None
    ) -> WriteStep:
        epoch = fence_of(run_id)
        try:
            if snapshot is not None:
                return await self.__save(run_id, snapshot, records, epoch)
            step: WriteStep | None = None

            def plan() -> WriteStep:  # built again when the transaction is: a port numbers its rows
                nonlocal step
                step = WriteStep(run_id, *record_rows(self.__sealer, run_id, records), None, None, epoch)
                return step

            await self.__driver.transact([run_id], plan, short=len(records) <= INLINE_RECORDS)
            assert step is not None
            return step
        except Fenced:
            raise await self.__fenced(run_id, epoch) from None
        except Exception as error:
            raise await self.__failed(run_id, epoch, error) from error

    async def __failed(self, run_id: str, epoch: int | None, error: Exception) -> Exception:
        """What a fenced write that failed raises: `RunFencedError` when the run changed hands
        meanwhile (a worker frozen inside its transaction, whose session the new owner ended: the
        run stops here, whatever the store said), else `error` itself."""
        if epoch is None or isinstance(error, _NOT_THE_STORE):
            return error
        try:
            lease = await self.get_lease(run_id)
        except Exception:
            return error
        if lease is not None and lease.epoch == epoch:
            return error
        return await self.__fenced(run_id, epoch)

    async def __fenced(self, run_id: str, epoch: int | None) -> RunFencedError:
        """The error for a write refused by the run's lease: who holds the run now, and since when.
        The refusal is noted in the lease's history first (`Change.REFUSED`)."""
        try:
            lease = await self.__note_refusal(run_id, epoch)
        except Exception:  # the refusal is what matters; the lease and the note are detail
            lease = None
        fenced_write(self, run_id, epoch, lease)
        return RunFencedError(run_id, epoch or 0, lease)

    async def __note_refusal(self, run_id: str, epoch: int | None) -> Lease | None:
        """Add a refused write at `epoch` to the run's lease history, by a compare-and-set on the lease
        exactly as read (its epoch and expiry), so that it never undoes a change of the lease's owner:
        a few tries, then the lease as it stands."""
        for _ in range(_NOTE_ATTEMPTS):
            read = await self.__driver.read_op(run_id, GetLease(run_id))
            lease = self.__lease(run_id, read)
            row = read.row
            if lease is None or row is None or epoch is None:
                return lease
            noted = with_refusal(lease, epoch=epoch, owner=f'{socket.gethostname()} pid {os.getpid()}')
            if noted is None:
                return lease
            body = _replace_history(row.body, noted)
            new = LeaseRow(run_id, row.epoch, row.state, row.host, 0.0, body)
            op = SwapLease(
                run_id,
                expect=row.epoch,
                expired=False,
                row=new,
                ttl=min(max(row.expires - read.now, 0.0), _MAX_TTL - 1),
                expect_expires=row.expires,
            )
            swap = cast(LeaseSwap, await self.__driver.write_op([run_id], op, retry=False))
            if swap.swapped:
                return self.__lease(run_id, swap.read)
        return self.__lease(run_id, await self.__driver.read_op(run_id, GetLease(run_id)))

    async def __save(
        self, run_id: str, snapshot: ContinuableSnapshot, records: Sequence[StepWrite], epoch: int | None
    ) -> WriteStep:
        """Save a snapshot with its run's records: find and encode the new messages, externalize their
        media, then write everything in one transaction.

        When the node the new messages hang off is gone (the run was deleted by another store or
        process), the history is written whole, once. When another writer recorded the snapshot's
        key meanwhile, the plan runs again and finds the key applied.
        """
        # The snapshot's list is read, not copied: it must not change until the save returns.
        messages = snapshot.messages
        save = _Save(messages if isinstance(messages, list) else list(messages))

        def prepare() -> bool:
            if save.delta is None:
                save.delta = self.__history.diff(run_id, save.messages)
                if save.delta.parent is not None and save.delta.parent_sum is None:
                    # the sums of the remembered nodes are unknown: write the history whole
                    self.__history.forget(run_id)
                    save.delta = self.__history.diff(run_id, save.messages)
            return save.delta.walked

        def plan() -> WriteStep:
            delta = save.delta
            assert delta is not None
            prev = NO_PREV if delta.parent is None else delta.parent_sum
            assert prev is not None
            bodies, save.sums = self.__sealer.nodes(run_id, delta.new_messages, prev)
            head_sum = save.sums[-1] if save.sums else (None if delta.parent is None else prev)
            state = SnapshotState(snapshot.state).value
            body = self.__sealer.seal(
                snapshot,
                SNAPSHOT_FIELDS_IN_ROW,
                (run_id, state, delta.total),
                SNAPSHOT_CLEAR,
                {HEAD_KEY: head_sum} if head_sum is not None else None,
            )
            row = SnapshotRow(run_id=run_id, state=state, head=None, length=delta.total, body=body)
            parent = cast(int | None, delta.parent)
            write = SnapshotWrite(key=snapshot.idempotency_key, parent=parent, bodies=bodies, row=row)
            rows = record_rows(self.__sealer, run_id, records)
            save.step = WriteStep(run_id, *rows, write, self.max_snapshots_per_run, epoch)
            return save.step

        restarted = False
        conflicts = 0
        while True:
            try:
                short = (
                    len(records) <= INLINE_RECORDS
                    and len(save.messages) - self.__history.saved_length(run_id) <= INLINE_NEW_MESSAGES
                )
                outcome = await self.__driver.transact([run_id], plan, prepare, short=short)
            except StaleHistory:
                if restarted:
                    raise
                restarted = True
                self.__history.forget(run_id)
                save.delta = None
                continue
            except KeyConflict:
                conflicts += 1
                if conflicts >= _KEY_CONFLICT_ATTEMPTS:
                    raise RuntimeError(
                        f'snapshot key {snapshot.idempotency_key!r} of run {run_id!r} kept conflicting with '
                        f'concurrent writers in {self.__where()}: retry the save'
                    ) from None
                continue
            if isinstance(outcome, NeedsWalk):
                assert save.delta is not None
                await self.__history.walk(save.delta)  # media go to the media store from the event loop
                continue
            break
        if outcome is not None:
            assert save.delta is not None
            self.__history.commit(save.delta, outcome, save.sums or ())
        assert save.step is not None
        return save.step

    # -- reads --------------------------------------------------------------------------------

    async def list_events(self, run_id: str) -> list[StepEvent]:
        return await self.list_events_page(run_id)

    async def list_events_page(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None, newest: bool = False
    ) -> list[StepEvent]:
        run_id = self.__run_id(run_id)
        check_event_window(after_seq, limit)
        op = ListEvents(run_id, after_seq=after_seq, limit=limit, newest=newest)
        answer, tally = await self.__read_counted(run_id, lambda: single(op))
        rows = cast(Sequence[EventRow], answer)
        check_ascending(run_id, 'events', [row.seq for row in rows if row.seq is not None], self.__where())
        if tally is not None:
            self.__check_events(run_id, rows, tally, after_seq, limit, newest)
        found: list[StepEvent] = []
        for row in rows:
            try:
                found.append(self.__rows.decode_event(row))
            except DamagedRecordError as error:
                skip_damaged(error)
        return event_window(found, after_seq, limit, newest)

    def __check_events(
        self,
        run_id: str,
        rows: Sequence[EventRow],
        tally: Tally,
        after_seq: int | None,
        limit: int | None,
        newest: bool,
    ) -> None:
        """Raise when the rows a port answered for a listing of events skip a seq or stop short of the tally."""
        after = after_seq or 0
        seqs = sorted(row.seq for row in rows if row.seq is not None and row.seq > after)
        if limit is not None and len(seqs) > limit:  # a port may answer more than the window
            seqs = seqs[-limit:] if newest else seqs[:limit]
        if newest and limit is not None and seqs:
            after = max(after, seqs[0] - 1)  # the window starts where it was cut
        elif newest and limit is not None:
            after = max(after, tally.events - limit)
        to_end = limit is None or newest or len(seqs) < limit
        gapless = self.__driver.port.gapless_events
        tally.short_events(run_id, seqs, after, to_end=to_end, gapless=gapless, where=self.__where())

    async def __effects(self, op: ListEffects, *, unresolved: bool = False) -> list[ToolEffectRecord]:
        # A ledger entry that cannot be read is an error: leaving it out could hide an effect in
        # flight. The unresolved ones are found here, not by the port, so that an entry whose
        # status or call id was altered is read (and its checksum fails) rather than filtered out.
        answer, tally = await self.__read_counted(op.run_id, lambda: single(op))
        rows = cast(Sequence[EffectRow], answer)
        if tally is not None and op.tool_call_id is None:
            tally.short_effects(op.run_id, len({row.tool_call_id for row in rows}), self.__where())
        latest: dict[str, ToolEffectRecord | None] = {}  # a port may answer a call's replaced rows first
        for row in rows:
            # A status column other than `started` is bound into the entry's checksum: an entry whose
            # bytes check as written is not unresolved and need not be decoded.
            if unresolved and row.status != _STARTED and self.__rows.checks_as_written(row.body, row):
                latest[row.tool_call_id] = None
            else:
                latest[row.tool_call_id] = self.__rows.decode_effect(row)
        found = [record for record in latest.values() if record is not None]
        if op.tool_call_id is not None:
            found = [r for r in found if r.tool_call_id == op.tool_call_id]
        if unresolved:
            found = [r for r in found if r.unresolved]
        found.sort(key=lambda r: sort_time(r.started_at))
        return found

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        run_id = self.__run_id(run_id)
        found = await self.__effects(ListEffects(run_id, tool_call_id=tool_call_id))
        return found[-1] if found else None

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return await self.__effects(ListEffects(self.__run_id(run_id)))

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return await self.__effects(ListEffects(self.__run_id(run_id)), unresolved=True)

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        run_id = self.__run_id(run_id)
        rows, nodes = await self.__snapshots(run_id, newest=True, complete_only=not include_interrupted)
        if not rows:
            return None
        return await self.__materialize(rows[-1], nodes)

    async def list_snapshots(self, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        run_id = self.__run_id(run_id)
        rows, nodes = await self.__snapshots(run_id, newest=False, complete_only=not include_interrupted)
        found: list[ContinuableSnapshot] = []
        for row in rows:
            try:
                found.append(await self.__materialize(row, nodes))
            except DamagedRecordError as error:
                skip_damaged(error)
        return found

    async def __snapshots(
        self, run_id: str, *, newest: bool, complete_only: bool
    ) -> tuple[Sequence[SnapshotRow], Mapping[int, Node]]:
        """The run's snapshot rows and their nodes (`read_snapshots`), checked against its tally."""
        (rows, nodes), tally = await self.__read_counted(
            run_id, lambda: read_snapshots(run_id, newest=newest, complete_only=complete_only)
        )
        seqs = [row.seq for row in rows if row.seq is not None]
        check_ascending(run_id, 'snapshots', seqs, self.__where())
        if tally is not None:
            tally.short_snapshots(run_id, seqs, newest_only=newest, complete_only=complete_only, where=self.__where())
        return rows, nodes

    async def list_snapshot_summaries(self, run_id: str, *, include_interrupted: bool = False) -> list[SnapshotSummary]:
        run_id = self.__run_id(run_id)
        op = ListSnapshots(run_id, complete_only=not include_interrupted)
        rows = cast(Sequence[SnapshotRow], await self.__driver.read_op(run_id, op))
        check_ascending(run_id, 'snapshots', [row.seq for row in rows if row.seq is not None], self.__where())
        found: list[SnapshotSummary] = []
        for row in rows:
            if not include_interrupted and row.state != SnapshotState.COMPLETE.value:
                continue
            try:
                header = self.__rows.decode_snapshot_header(row)
            except DamagedRecordError as error:
                skip_damaged(error)
                continue
            found.append(SnapshotSummary.of(header, message_count=row.length))
        return found

    async def get_snapshot(self, run_id: str, seq: int) -> ContinuableSnapshot | None:
        run_id = self.__run_id(run_id)
        check_seq(seq)
        row, nodes = await self.__driver.read(run_id, lambda: read_snapshot(run_id, seq))
        return await self.__materialize(row, nodes) if row is not None else None

    async def get_snapshot_messages(
        self, run_id: str, seq: int, *, start: int = 0, stop: int | None = None
    ) -> SnapshotMessages | None:
        run_id = self.__run_id(run_id)
        check_seq(seq)
        check_message_window(start, stop)
        row, nodes = await self.__driver.read(run_id, lambda: read_snapshot(run_id, seq))
        if row is None:
            return None
        begin = min(start, row.length)
        end = row.length if stop is None else max(begin, min(stop, row.length))
        snapshot = await self.__materialize(row, nodes, window=(begin, end))
        return SnapshotMessages(
            summary=SnapshotSummary.of(snapshot, message_count=row.length), start=begin, messages=snapshot.messages
        )

    async def shared_message_count(self, run_id: str, seq: int, other_seq: int) -> int:
        # Each message is one node, and a node's id stands for its whole history (it hangs off the
        # node before it): the snapshots share their messages up to the last position whose nodes
        # are the same. No message is decoded.
        run_id = self.__run_id(run_id)
        check_seq(seq)
        check_seq(other_seq)
        chains: list[list[int]] = []
        for wanted in (seq, other_seq):
            row, nodes = await self.__driver.read(run_id, partial(read_snapshot, run_id, wanted))
            if row is None:
                raise LookupError(f'run {run_id!r} has no retained snapshot with seq {wanted}')
            chains.append(
                decoded(
                    lambda row=row, nodes=nodes: self.__rows.chain(row, nodes)[0],
                    run_id=run_id,
                    record=f'snapshot seq={wanted}',
                    where=self.__where(),
                )
            )
        return shared_prefix(chains[0], chains[1])

    async def __materialize(
        self, row: SnapshotRow, nodes: Mapping[int, Node], *, window: tuple[int, int] | None = None
    ) -> ContinuableSnapshot:
        """A snapshot back from its row and the run's nodes; `DamagedRecordError` naming what is broken.

        With `window=(start, stop)` only those messages are decoded (every message is still checked).
        """
        record = f'snapshot seq={row.seq}'
        where = self.__where()
        header, head_sum, sealed = self.__rows.snapshot_header(row)
        chain: list[int] = []

        def read_messages() -> list[bytes]:
            ids, stored = self.__rows.chain(row, nodes)
            chain.extend(ids)
            for position, body in enumerate(stored):
                if type(body) is not bytes:  # a damaged column type (an integer where a blob was)
                    raise ValueError(f'message {position} (node {ids[position]}) is not stored as bytes')
            try:
                return self.__sealer.open_nodes(row.run_id, stored, head_sum, sealed=sealed)
            except MessageDamage as error:
                node = chain[error.position] if error.position < len(chain) else '?'
                raise ValueError(f'message {error.position} (node {node}) is damaged: {error.reason}') from error

        bodies = decoded(read_messages, run_id=row.run_id, record=record, where=where)
        first = 0
        if window is not None:
            first = window[0]
            bodies = bodies[first : window[1]]
        try:
            messages = await self.__history.decode(bodies)
        except (ValueError, LookupError, TypeError) as error:
            raise await self.__damaged_message(row, chain[first:], bodies, error, first=first) from error
        return header.model_copy(update={'messages': messages})

    async def __damaged_message(
        self, row: SnapshotRow, chain: Sequence[int], bodies: Sequence[bytes], error: BaseException, *, first: int = 0
    ) -> DamagedRecordError:
        """The error naming the first message of a snapshot that cannot be read (slow path: one at a time)."""
        reason = f'{type(error).__name__}: {error}'
        for position, (node, body) in enumerate(zip(chain, bodies, strict=True), start=first):
            try:
                decode_messages([await self.__history.walker.restore(body)])
            except (ValueError, LookupError, TypeError) as bad:
                reason = f'message {position} (node {node}) is damaged: {type(bad).__name__}: {bad}'
                break
        return DamagedRecordError(
            run_id=row.run_id, record=f'snapshot seq={row.seq}', where=self.__where(), reason=reason
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
        return cast(str, await self.__driver.write_op((), StoreIdentity(uuid.uuid4().hex)))

    async def store_location(self) -> str:
        """Where the store's data lives, naming it for a person without a password: the real path of
        a database file or folder, a database's name, a key or table prefix (see `ops.StoreLocation`).
        The same for every store object on the same data."""
        return cast(str, await self.__driver.read_op(None, StoreLocation()))

    # -- whole-store maintenance --------------------------------------------------------------

    async def check_integrity(self) -> list[str] | None:
        """What the backend's own integrity check finds wrong in the whole store (empty: nothing),
        `None` when the backend has none (see `stepcore.check_store`)."""
        found = await self.__driver.read_op(None, CheckIntegrity())
        return None if found is None else list(cast(Sequence[str], found))

    async def counts_records(self, run_id: str) -> bool | None:
        """Whether the run's lease holds a count of its records that checks (`stepcore.engine._tally`):
        runs written without a lease, or by a release before counts, have none."""
        run_id = self.__run_id(run_id)
        if LEASES not in type(self).features:
            return False
        with contextlib.suppress(Exception):
            read = cast(LeaseRead, await self.__driver.read_op(run_id, GetLease(run_id)))
            return tally_of(run_id, read, self.__where()) is not None
        return False

    async def stored_run_ids(self) -> list[str]:
        """The id of every run this store holds a run record or a snapshot of, sorted.

        Unlike `list_runs`, a run whose record is damaged or missing (a snapshot saved without
        `register_run`, a run killed after it took its lease and before it registered) is included:
        maintenance must not overlook what it cannot read.
        """
        found = set(cast(Sequence[str], await self.__driver.read_op(None, ListRunIds())))
        if LEASES in type(self).features:
            live = (LeaseState.RUNNING, LeaseState.WAITING, LeaseState.PENDING, LeaseState.RESUMED)
            found |= {lease.run_id for lease in await self.list_leases(live)}
        return sorted(found)

    async def media_references(self, run_id: str) -> set[str]:
        """The `media+sha256://` URIs that the run's snapshots (complete and interrupted) reference.

        Read from the stored messages, without fetching a blob. Unlike `list_snapshots`, a snapshot
        that cannot be read is not skipped: `DamagedRecordError` names it, since leaving its
        references out would let its media be collected.
        """
        run_id = self.__run_id(run_id)
        rows, nodes = await self.__driver.read(
            run_id, partial(read_snapshots, run_id, newest=False, complete_only=False)
        )
        found: set[str] = set()
        for row in rows:
            # Each chain is opened as a read opens it (checksums checked, bodies decrypted), so a
            # damaged message stops the collection rather than hiding its references.
            _, head_sum, sealed = self.__rows.snapshot_header(row)

            def lookup(node: object) -> Node:
                entry = nodes.get(cast(int, node))
                if entry is None:
                    raise LookupError(f'message node {node} is missing')
                return entry

            def references(row: SnapshotRow = row, head_sum: str | None = head_sum, sealed: bool = sealed) -> set[str]:
                stored = walk_chain(row.head, row.length, lookup)
                try:
                    bodies = self.__sealer.open_nodes(row.run_id, stored, head_sum, sealed=sealed)
                except MessageDamage as error:
                    raise ValueError(f'message {error.position} is damaged: {error.reason}') from error
                refs: set[str] = set()
                for body in bodies:
                    refs |= stored_references(body)
                return refs

            found |= decoded(references, run_id=run_id, record=f'snapshot seq={row.seq}', where=self.__where())
        if LEASES in type(self).features:
            found |= await self.__start_references(run_id)
        return found

    async def __start_references(self, run_id: str) -> set[str]:
        """The media the run's start point references (a restart reads them)."""
        refs: set[str] = set()
        for body in await self.__start(run_id) or ():
            refs |= stored_references(body)
        return refs

    async def __start(self, run_id: str) -> list[bytes] | None:
        """The stored bodies of the run's start point, checked (`DamagedRecordError` naming it); `None`: none."""
        blob = cast(bytes | None, await self.__driver.read_op(run_id, GetLeaseStart(run_id)))
        if blob is None:
            return None

        def opened() -> list[bytes]:
            head, _, rest = bytes(blob).partition(b'\n')
            bodies = rest.split(b'\n') if rest else []
            try:
                return self.__sealer.open_nodes(run_id, bodies, head.decode() or None, sealed=True)
            except MessageDamage as error:
                raise ValueError(f'message {error.position} is damaged: {error.reason}') from error

        return decoded(opened, run_id=run_id, record='start point', where=self.__where())

    async def __read_counted(self, run_id: str, plan: Callable[[], Plan[T]]) -> tuple[T, Tally | None]:
        """The answer of the plan `plan()` makes and the run's tally (`None`: the store keeps no
        leases, or the run has no tally), read with it: see `stepcore.engine._tally`."""
        if LEASES not in type(self).features:
            return await self.__driver.read(run_id, plan), None
        try:
            result, lease = await self.__driver.read(run_id, lambda: leased_plan(run_id, plan()))
        except Exception as error:  # the lease or the records: read the records alone to tell which
            result = await self.__driver.read(run_id, plan)
            tally_unknown(run_id, self.__where(), f'its lease cannot be read: {error}')
            return result, None
        return result, tally_of(run_id, lease, self.__where())

    # -- leases (feature `leases`: see `stepcore.store.leases`) ---------------------------------

    def __lease(self, run_id: str, read: LeaseRead) -> Lease | None:
        row = read.row
        if row is None:
            return None
        try:
            return decode_lease_body(run_id, row.epoch, row.state, row.expires, read.now, row.body)
        except (ValueError, TypeError, KeyError) as error:
            raise DamagedRecordError(
                run_id=run_id, record='lease', where=self.__where(), reason=f'{type(error).__name__}: {error}'
            ) from None

    async def get_lease(self, run_id: str) -> Lease | None:
        """The run's lease, read with the store's clock; `None` when it has none."""
        require_feature(self, LEASES, option='get_lease')
        run_id = self.__run_id(run_id)
        return self.__lease(run_id, await self.__driver.read_op(run_id, GetLease(run_id)))

    async def swap_lease(
        self,
        lease: Lease,
        *,
        expect: int | None,
        expired: bool = False,
        ttl: float,
        start: Sequence[ModelMessage] | None = None,
    ) -> tuple[bool, Lease | None]:
        """Compare and set the run's lease (see `stepcore.engine._ops.SwapLease`): store `lease`, held
        for `ttl` seconds from now on the store's clock, when the run has no lease (`expect=None`) or
        its lease has epoch `expect` (and, with `expired`, has expired on the store's clock).

        `start` stores the history a restart of the run needs with it. Answers whether it matched and
        the lease as it is now.
        """
        require_feature(self, LEASES, option='swap_lease')
        run_id = self.__run_id(lease.run_id)
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 <= ttl < _MAX_TTL:
            raise ValueError(f'ttl={ttl!r} cannot hold a lease: pass a finite number of seconds from 0 up')
        blob = None if start is None else await self.__seal_start(run_id, start)
        # what the run holds now, read before the swap: a lower bound of what any later read finds;
        # and its lease, for the refused writes noted in it since the caller read it (kept)
        tally, read = await self.__driver.read(run_id, lambda: swap_plan(run_id))
        if expect is not None and read.row is not None and read.row.epoch == expect:
            with contextlib.suppress(DamagedRecordError):  # a damaged lease has no notes to keep
                lease = _keep_refusals(lease, self.__lease(run_id, read))
        row = LeaseRow(
            run_id=run_id,
            epoch=lease.epoch,
            state=LeaseState(lease.state).value,
            host=lease.owner.host if lease.owner is not None else '',
            expires=0.0,
            body=with_tally(encode_lease_body(lease), run_id, tally),
        )
        op = SwapLease(run_id, expect=expect, expired=expired, row=row, ttl=float(ttl), start=blob)
        swap = cast(LeaseSwap, await self.__driver.write_op([run_id], op, retry=False))
        return swap.swapped, self.__lease(run_id, swap.read)

    async def list_leases(self, states: Sequence[LeaseState | str]) -> list[Lease]:
        """The leases in one of `states` (never `ended`), through the store's index of states."""
        require_feature(self, LEASES, option='list_leases')
        wanted = tuple(LeaseState(s).value for s in states)
        if LeaseState.ENDED.value in wanted:
            raise ValueError("list_leases lists live states only: leave 'ended' out (every finished run has it)")
        rows, now = cast(tuple[Sequence[LeaseRow], float], await self.__driver.read_op(None, ListLeases(wanted)))
        found: list[Lease] = []
        for row in rows:
            try:
                lease = self.__lease(row.run_id, LeaseRead(row, now))
            except DamagedRecordError as error:
                skip_damaged(error)
                continue
            if lease is not None:
                found.append(lease)
        return found

    async def lease_start(self, run_id: str) -> list[ModelMessage] | None:
        """The history stored with the run's lease for a restart (its first request), or `None`."""
        require_feature(self, LEASES, option='lease_start')
        run_id = self.__run_id(run_id)
        stored = await self.__start(run_id)
        if stored is None:
            return None
        try:
            return await self.__history.decode(stored)
        except (ValueError, LookupError, TypeError) as error:
            raise DamagedRecordError(
                run_id=run_id, record='start point', where=self.__where(), reason=f'{type(error).__name__}: {error}'
            ) from error

    async def __seal_start(self, run_id: str, messages: Sequence[ModelMessage]) -> bytes:
        """The start point's stored form: its messages' stored bodies sealed as one chain, one per line."""
        walker = self.__history.walker
        stored = [await walker.externalize(encode_message(m)) for m in messages]
        bodies, sums = self.__sealer.nodes(run_id, stored, NO_PREV)
        return (sums[-1] if sums else '').encode() + b'\n' + b'\n'.join(bodies)

    # -- keys ---------------------------------------------------------------------------------

    async def stored_key_ids(self, run_id: str) -> set[str | None]:
        """The encryption key ids the run's stored bodies were written with (`None`: in clear).

        Covers the run record, events, ledger, snapshot headers and the messages of stored
        snapshots; a body that does not parse counts as `None`. `stepcore rekey` uses it to find
        the runs still to re-encrypt.
        """
        run_id = self.__run_id(run_id)

        def plan() -> Plan[list[Body]]:
            run = cast(RunRow | None, (yield GetRun(run_id)))
            events = cast(Sequence[EventRow], (yield ListEvents(run_id)))
            effects = cast(Sequence[EffectRow], (yield ListEffects(run_id)))
            rows, nodes = yield from read_snapshots(run_id, newest=False, complete_only=False)
            bodies: list[Body] = [] if run is None else [run.body]
            bodies += [r.body for r in (*events, *effects, *rows)]
            bodies += [body for _, body in nodes.values()]
            return bodies

        return {key_id_of(body) for body in await self.__driver.read(run_id, plan)}

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        await self.__driver.close()
