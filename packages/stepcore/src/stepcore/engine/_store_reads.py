"""Reads: a run's events, ledger entries and snapshots back from their rows, checked.

A record that does not read raises `DamagedRecordError` naming it (a listing skips it where the
contract lets it); a listing is read with the run's tally where the run has one, and one that comes
back short of it is damage too (`_tally.py`). A snapshot's messages are read from its chain of
nodes, every one checked, only those asked for decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Final, TypeVar, cast

from stepcore.common.damage import DamagedRecordError, decoded, skip_damaged
from stepcore.common.features import LEASES
from stepcore.engine._driver import single
from stepcore.engine._ops import EffectRow, EventRow, ListEffects, ListEvents, ListSnapshots, Node, SnapshotRow
from stepcore.engine._plans import Plan, read_snapshot, read_snapshots
from stepcore.engine._seal import MessageDamage
from stepcore.engine._store_base import EngineBase
from stepcore.engine._tally import Tally, check_ascending, leased_plan, tally_of, tally_unknown
from stepcore.store.arguments import check_event_window, check_message_window, check_seq, event_window, shared_prefix
from stepcore.store.codec import decode_messages
from stepcore.store.lifecycle import sort_time
from stepcore.store.models import (
    ContinuableSnapshot,
    SnapshotMessages,
    SnapshotState,
    SnapshotSummary,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)

__all__ = ('StoreReads',)


T = TypeVar('T')

_STARTED: Final = ToolEffectStatus.STARTED.value


class StoreReads(EngineBase):
    """`EngineStore`'s reads: events, ledger entries, snapshots and their summaries."""

    async def list_events(self, run_id: str) -> list[StepEvent]:
        return await self.list_events_page(run_id)

    async def list_events_page(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None, newest: bool = False
    ) -> list[StepEvent]:
        run_id = self._engine_run_id(run_id)
        check_event_window(after_seq, limit)
        op = ListEvents(run_id, after_seq=after_seq, limit=limit, newest=newest)
        answer, tally = await self._engine_read_counted(run_id, lambda: single(op))
        rows = cast(Sequence[EventRow], answer)
        check_ascending(run_id, 'events', [row.seq for row in rows if row.seq is not None], self._engine_where())
        if tally is not None:
            self.__check_events(run_id, rows, tally, after_seq, limit, newest)
        found: list[StepEvent] = []
        for row in rows:
            try:
                found.append(self._engine_rows.decode_event(row))
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
        gapless = self._engine_driver.port.gapless_events
        tally.short_events(run_id, seqs, after, to_end=to_end, gapless=gapless, where=self._engine_where())

    async def __effects(self, op: ListEffects, *, unresolved: bool = False) -> list[ToolEffectRecord]:
        # A ledger entry that cannot be read is an error: leaving it out could hide an effect in
        # flight. The unresolved ones are found here, not by the port, so that an entry whose
        # status or call id was altered is read (and its checksum fails) rather than filtered out.
        answer, tally = await self._engine_read_counted(op.run_id, lambda: single(op))
        rows = cast(Sequence[EffectRow], answer)
        if tally is not None and op.tool_call_id is None:
            tally.short_effects(op.run_id, len({row.tool_call_id for row in rows}), self._engine_where())
        latest: dict[str, ToolEffectRecord | None] = {}  # a port may answer a call's replaced rows first
        for row in rows:
            # A status column other than `started` is bound into the entry's checksum: an entry whose
            # bytes check as written is not unresolved and need not be decoded.
            if unresolved and row.status != _STARTED and self._engine_rows.checks_as_written(row.body, row):
                latest[row.tool_call_id] = None
            else:
                latest[row.tool_call_id] = self._engine_rows.decode_effect(row)
        found = [record for record in latest.values() if record is not None]
        if op.tool_call_id is not None:
            found = [r for r in found if r.tool_call_id == op.tool_call_id]
        if unresolved:
            found = [r for r in found if r.unresolved]
        found.sort(key=lambda r: sort_time(r.started_at))
        return found

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        run_id = self._engine_run_id(run_id)
        found = await self.__effects(ListEffects(run_id, tool_call_id=tool_call_id))
        return found[-1] if found else None

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return await self.__effects(ListEffects(self._engine_run_id(run_id)))

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return await self.__effects(ListEffects(self._engine_run_id(run_id)), unresolved=True)

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        run_id = self._engine_run_id(run_id)
        rows, nodes = await self.__snapshots(run_id, newest=True, complete_only=not include_interrupted)
        if not rows:
            return None
        return await self.__materialize(rows[-1], nodes)

    async def list_snapshots(self, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        run_id = self._engine_run_id(run_id)
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
        (rows, nodes), tally = await self._engine_read_counted(
            run_id, lambda: read_snapshots(run_id, newest=newest, complete_only=complete_only)
        )
        seqs = [row.seq for row in rows if row.seq is not None]
        check_ascending(run_id, 'snapshots', seqs, self._engine_where())
        if tally is not None:
            tally.short_snapshots(
                run_id, seqs, newest_only=newest, complete_only=complete_only, where=self._engine_where()
            )
        return rows, nodes

    async def list_snapshot_summaries(self, run_id: str, *, include_interrupted: bool = False) -> list[SnapshotSummary]:
        run_id = self._engine_run_id(run_id)
        op = ListSnapshots(run_id, complete_only=not include_interrupted)
        rows = cast(Sequence[SnapshotRow], await self._engine_driver.read_op(run_id, op))
        check_ascending(run_id, 'snapshots', [row.seq for row in rows if row.seq is not None], self._engine_where())
        found: list[SnapshotSummary] = []
        for row in rows:
            if not include_interrupted and row.state != SnapshotState.COMPLETE.value:
                continue
            try:
                header = self._engine_rows.decode_snapshot_header(row)
            except DamagedRecordError as error:
                skip_damaged(error)
                continue
            found.append(SnapshotSummary.of(header, message_count=row.length))
        return found

    async def get_snapshot(self, run_id: str, seq: int) -> ContinuableSnapshot | None:
        run_id = self._engine_run_id(run_id)
        check_seq(seq)
        row, nodes = await self._engine_driver.read(run_id, lambda: read_snapshot(run_id, seq))
        return await self.__materialize(row, nodes) if row is not None else None

    async def get_snapshot_messages(
        self, run_id: str, seq: int, *, start: int = 0, stop: int | None = None
    ) -> SnapshotMessages | None:
        run_id = self._engine_run_id(run_id)
        check_seq(seq)
        check_message_window(start, stop)
        row, nodes = await self._engine_driver.read(run_id, lambda: read_snapshot(run_id, seq))
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
        run_id = self._engine_run_id(run_id)
        check_seq(seq)
        check_seq(other_seq)
        chains: list[list[int]] = []
        for wanted in (seq, other_seq):
            row, nodes = await self._engine_driver.read(run_id, partial(read_snapshot, run_id, wanted))
            if row is None:
                raise LookupError(f'run {run_id!r} has no retained snapshot with seq {wanted}')
            chains.append(
                decoded(
                    lambda row=row, nodes=nodes: self._engine_rows.chain(row, nodes)[0],
                    run_id=run_id,
                    record=f'snapshot seq={wanted}',
                    where=self._engine_where(),
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
        where = self._engine_where()
        header, head_sum, sealed = self._engine_rows.snapshot_header(row)
        chain: list[int] = []

        def read_messages() -> list[bytes]:
            ids, stored = self._engine_rows.chain(row, nodes)
            chain.extend(ids)
            for position, body in enumerate(stored):
                if type(body) is not bytes:  # a damaged column type (an integer where a blob was)
                    raise ValueError(f'message {position} (node {ids[position]}) is not stored as bytes')
            try:
                return self._engine_sealer.open_nodes(row.run_id, stored, head_sum, sealed=sealed)
            except MessageDamage as error:
                node = chain[error.position] if error.position < len(chain) else '?'
                raise ValueError(f'message {error.position} (node {node}) is damaged: {error.reason}') from error

        bodies = decoded(read_messages, run_id=row.run_id, record=record, where=where)
        first = 0
        if window is not None:
            first = window[0]
            bodies = bodies[first : window[1]]
        try:
            messages = await self._engine_history.decode(bodies)
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
                decode_messages([await self._engine_history.walker.restore(body)])
            except (ValueError, LookupError, TypeError) as bad:
                reason = f'message {position} (node {node}) is damaged: {type(bad).__name__}: {bad}'
                break
        return DamagedRecordError(
            run_id=row.run_id, record=f'snapshot seq={row.seq}', where=self._engine_where(), reason=reason
        )

    async def _engine_read_counted(self, run_id: str, plan: Callable[[], Plan[T]]) -> tuple[T, Tally | None]:
        """The answer of the plan `plan()` makes and the run's tally (`None`: the store keeps no
        leases, or the run has no tally), read with it: see `stepcore.engine._tally`."""
        if LEASES not in type(self).features:
            return await self._engine_driver.read(run_id, plan), None
        try:
            result, lease = await self._engine_driver.read(run_id, lambda: leased_plan(run_id, plan()))
        except Exception as error:  # the lease or the records: read the records alone to tell which
            result = await self._engine_driver.read(run_id, plan)
            tally_unknown(run_id, self._engine_where(), f'its lease cannot be read: {error}')
            return result, None
        return result, tally_of(run_id, lease, self._engine_where())
