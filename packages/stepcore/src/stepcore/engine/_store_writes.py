"""Writes: events, ledger entries and snapshots into rows, one transaction per run and step.

Every record a batch holds is checked before anything is written, then each run's share goes in
one transaction: a snapshot's new messages are found against the run's history index
(`_history.py`), sealed and written with it. A write the run's lease refuses (`Fenced`) raises
`RunFencedError`, after noting the refusal in the lease's history.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from pydantic_ai.messages import ModelMessage

from stepcore.common.damage import DamagedRecordError
from stepcore.common.telemetry import fenced_write
from stepcore.engine._driver import INLINE_NEW_MESSAGES, INLINE_RECORDS, NeedsWalk
from stepcore.engine._history import HistoryDelta
from stepcore.engine._ops import GetLease, LeaseRow, LeaseSwap, SnapshotRow, SnapshotWrite, SwapLease, WriteStep
from stepcore.engine._plans import Fenced, KeyConflict, StaleHistory
from stepcore.engine._port import check_text
from stepcore.engine._rows import SNAPSHOT_CLEAR, SNAPSHOT_FIELDS_IN_ROW, record_rows
from stepcore.engine._seal import HEAD_KEY, NO_PREV
from stepcore.engine._store_base import MAX_TTL, EngineBase
from stepcore.store.arguments import check_writes
from stepcore.store.leases import Lease, RunFencedError, fence_of, with_refusal
from stepcore.store.models import ContinuableSnapshot, SnapshotState, StepEvent, ToolEffectRecord
from stepcore.store.protocols import StepWrite

__all__ = ('StoreWrites',)


_KEY_CONFLICT_ATTEMPTS = 5

_NOTE_ATTEMPTS: Final = 3
_NOT_THE_STORE: Final = (ValueError, TypeError, LookupError, KeyConflict, StaleHistory, DamagedRecordError)
"""Errors of a write that say what is wrong with it, not with the store."""


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


class StoreWrites(EngineBase):
    """`EngineStore`'s writes: `write_batch`, `write_step` and the single-record writes."""

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
                run_id = self._engine_run_id(given)
            by_run.setdefault(run_id, []).append(write)
        if snapshot is not None:
            run_id = self._engine_run_id(snapshot.run_id)
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
                step = WriteStep(run_id, *record_rows(self._engine_sealer, run_id, records), None, None, epoch)
                return step

            await self._engine_driver.transact([run_id], plan, short=len(records) <= INLINE_RECORDS)
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
            read = await self._engine_driver.read_op(run_id, GetLease(run_id))
            lease = self._engine_lease(run_id, read)
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
                ttl=min(max(row.expires - read.now, 0.0), MAX_TTL - 1),
                expect_expires=row.expires,
            )
            swap = cast(LeaseSwap, await self._engine_driver.write_op([run_id], op, retry=False))
            if swap.swapped:
                return self._engine_lease(run_id, swap.read)
        return self._engine_lease(run_id, await self._engine_driver.read_op(run_id, GetLease(run_id)))

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
                save.delta = self._engine_history.diff(run_id, save.messages)
                if save.delta.parent is not None and save.delta.parent_sum is None:
                    # the sums of the remembered nodes are unknown: write the history whole
                    self._engine_history.forget(run_id)
                    save.delta = self._engine_history.diff(run_id, save.messages)
            return save.delta.walked

        def plan() -> WriteStep:
            delta = save.delta
            assert delta is not None
            prev = NO_PREV if delta.parent is None else delta.parent_sum
            assert prev is not None
            bodies, save.sums = self._engine_sealer.nodes(run_id, delta.new_messages, prev)
            head_sum = save.sums[-1] if save.sums else (None if delta.parent is None else prev)
            state = SnapshotState(snapshot.state).value
            body = self._engine_sealer.seal(
                snapshot,
                SNAPSHOT_FIELDS_IN_ROW,
                (run_id, state, delta.total),
                SNAPSHOT_CLEAR,
                {HEAD_KEY: head_sum} if head_sum is not None else None,
            )
            row = SnapshotRow(run_id=run_id, state=state, head=None, length=delta.total, body=body)
            parent = cast(int | None, delta.parent)
            write = SnapshotWrite(key=snapshot.idempotency_key, parent=parent, bodies=bodies, row=row)
            rows = record_rows(self._engine_sealer, run_id, records)
            save.step = WriteStep(run_id, *rows, write, self.max_snapshots_per_run, epoch)
            return save.step

        restarted = False
        conflicts = 0
        while True:
            try:
                short = (
                    len(records) <= INLINE_RECORDS
                    and len(save.messages) - self._engine_history.saved_length(run_id) <= INLINE_NEW_MESSAGES
                )
                outcome = await self._engine_driver.transact([run_id], plan, prepare, short=short)
            except StaleHistory:
                if restarted:
                    raise
                restarted = True
                self._engine_history.forget(run_id)
                save.delta = None
                continue
            except KeyConflict:
                conflicts += 1
                if conflicts >= _KEY_CONFLICT_ATTEMPTS:
                    raise RuntimeError(
                        f'snapshot key {snapshot.idempotency_key!r} of run {run_id!r} kept conflicting with '
                        f'concurrent writers in {self._engine_where()}: retry the save'
                    ) from None
                continue
            if isinstance(outcome, NeedsWalk):
                assert save.delta is not None
                await self._engine_history.walk(save.delta)  # media go to the media store from the event loop
                continue
            break
        if outcome is not None:
            assert save.delta is not None
            self._engine_history.commit(save.delta, outcome, save.sums or ())
        assert save.step is not None
        return save.step
