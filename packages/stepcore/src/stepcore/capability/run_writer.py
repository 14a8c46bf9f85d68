"""`RunWriter`: how one run's records reach the store, in order and keeping the crash rule."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest
from pydantic_ai.tools import RunContext

from stepcore.capability.events import announce_snapshot
from stepcore.capability.operations import StepOperations
from stepcore.common.telemetry import store_write
from stepcore.engine import EngineStore, sealed_size
from stepcore.store.contract import own_extension, write_records
from stepcore.store.models import ContinuableSnapshot, SnapshotState, StepEvent, ToolEffectRecord
from stepcore.store.protocols import StepWrite
from stepcore.store.step_store import StepStore

__all__ = ('DEFERRED_WRITE_DELAY', 'RunWriter')

DEFERRED_WRITE_DELAY = 0.01
"""Seconds a deferred write (a model request's completion, a failed tool call, a tool cycle's
snapshot) waits at most for the run's next write before it is written on its own (when the event
loop is free). A completed tool call never goes on its own: it waits for its snapshot."""

logger = logging.getLogger('stepcore')

_Completion = tuple[ToolEffectRecord, StepEvent]


class RunWriter:
    """Writes one run's events, ledger entries and snapshots; `SnapshotSaved` follows each snapshot.

    Direct path (no durable engine journals the run): each `write` goes to the store in one
    `write_batch`, after the deferred writes, so the run's records reach the store in order.

    - `defer`red writes travel with the run's next write, which saves round trips per step; a timer
      writes them on their own within `DEFERRED_WRITE_DELAY` seconds of free event loop, so
      nothing waits longer while a model request, a slow hook or a sibling tool call runs.
    - A completed tool call's ledger entry and event are `hold`: they go only in the batch of a
      `complete` snapshot that holds the call's result (the store writes that snapshot first),
      never on their own. A call whose result reaches no such snapshot stays `started`.

    Journaled path (a durable engine runs the capability's operations): every record is its own
    durable operation, written at once; a snapshot's operation runs before the completions it
    takes along.
    """

    def __init__(self, store: StepStore, operations: StepOperations[Any], *, journaled: bool, run_id: str) -> None:
        self.store = store
        self.journaled = journaled
        self.run_id = run_id
        self._operations = operations
        self._own_batch = own_extension(store, 'write_batch')
        """Whether the store's `write_batch` is its own (see `write_records`): its class decides, once."""
        self._write_step = (
            store.write_step
            if isinstance(store, EngineStore) and self._own_batch and type(store).write_batch is EngineStore.write_batch
            else None
        )
        """The engine's write of one run's step, for a store whose batches are the engine's own: the
        records were built here for this run, so they are not checked again on their way down."""
        self._deferred: list[StepWrite] = []
        self._deferred_snapshot: ContinuableSnapshot | None = None
        """A snapshot that travels with the run's next write, after `_deferred` (which then ends
        with the completions it takes along)."""
        self._held: list[_Completion] = []
        self._unannounced: list[ContinuableSnapshot] = []
        """Written snapshots whose `SnapshotSaved` is still to be emitted: right after the write, or,
        for one a background flush wrote, by the next write made from a hook."""
        self._lock = asyncio.Lock()
        self._due: float | None = None
        """When (event loop time) the deferred writes are written on their own, unless a write takes
        them first; `None` while nothing deferred waits for the timer."""
        self._timer: asyncio.TimerHandle | None = None
        """The pending timer, due at `_timer_when` on `_timer_loop`. A write does not cancel it: it
        clears `_due`, and the timer, when it fires, finds nothing to do or a later `_due` to wait
        for. So a run deferring and writing several times per step arms at most one timer per
        `DEFERRED_WRITE_DELAY`, instead of arming and cancelling one per deferral."""
        self._timer_when = 0.0
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        """Background flushes of deferred writes, kept referenced while they run."""
        self.failed: Exception | None = None
        """The error of the newest write the store refused or failed (`None`: none failed)."""

    async def write(
        self,
        ctx: RunContext[Any],
        *writes: StepWrite,
        snapshot: ContinuableSnapshot | None = None,
        new_call: bool = False,
    ) -> list[StepWrite]:
        """Write the deferred records, `writes` and `snapshot` now; returns `writes` as stored.

        `new_call` marks a tool call's `started` entry written before the tool runs.
        """
        if self.journaled:
            done = await self._journal(ctx, writes, snapshot, new_call=new_call)
        else:
            async with self._lock:
                self._due = None  # the deferred writes go now: the timer has nothing left to do
                await self._apply(writes, snapshot)
            done = list(writes)
        await self._announce(ctx)
        return done

    async def defer(
        self, ctx: RunContext[Any], *writes: StepWrite, snapshot: ContinuableSnapshot | None = None
    ) -> None:
        """Let `writes` and `snapshot` travel with the run's next write (written at once when journaled)."""
        if self.journaled or (snapshot is not None and self._deferred_snapshot is not None) or not self._arm_timer():
            await self.write(ctx, *writes, snapshot=snapshot)
            return
        if snapshot is not None:
            self._deferred.extend(_flat(self._release(snapshot)))
            self._deferred_snapshot = snapshot
        self._deferred.extend(writes)

    def hold(self, record: ToolEffectRecord, event: StepEvent) -> None:
        """Keep a completed call's entry and event until a complete snapshot holds the call's result."""
        self._held.append((record, event))

    async def pause(
        self,
        ctx: RunContext[Any],
        event: StepEvent,
        *,
        snapshot: ContinuableSnapshot | None,
        history: Sequence[ModelMessage],
    ) -> None:
        """Write a paused run's `snapshot` (when not saved yet) and its pause `event`, with the held
        completions of the calls `history` answers, in one write.

        The paused history is never `complete` (the deferred calls are open in it), yet it holds the
        results of the calls that ran beside them: a run resumed from it never runs those again, so
        their entries are `completed` with it. The order keeps the pause the run's newest event, and
        keeps those entries `started` until the pause is written (for a store whose batch is not
        atomic): the completion events, the pause, then the entries.
        """
        answered = _answered(history, {record.tool_call_id for record, _ in self._held})
        released = [c for c in self._held if c[0].tool_call_id in answered]
        self._held = [c for c in self._held if c[0].tool_call_id not in answered]
        writes = [*(done for _, done in released), event, *(record for record, _ in released)]
        await self.write(ctx, *writes, snapshot=snapshot)

    def end(self) -> None:
        """At the end of the run: completions still held are dropped, their calls stay `started`."""
        if self._held:
            logger.debug(
                'run %r ended with calls %s returned but in no complete snapshot: they stay started',
                self.run_id,
                [record.tool_call_id for record, _ in self._held],
            )
            self._held = []

    def _release(self, snapshot: ContinuableSnapshot) -> list[_Completion]:
        """Take the held completions `snapshot` may carry: it is complete and answers their calls."""
        if not self._held or snapshot.state is not SnapshotState.COMPLETE:
            return []
        answered = _answered(snapshot.messages, {record.tool_call_id for record, _ in self._held})
        released = [c for c in self._held if c[0].tool_call_id in answered]
        self._held = [c for c in self._held if c[0].tool_call_id not in answered]
        return released

    async def _apply(self, writes: Sequence[StepWrite], snapshot: ContinuableSnapshot | None) -> None:
        """The deferred writes and snapshot, then `writes` and `snapshot` (lock held).

        One `write_batch`, or two when a deferred snapshot and `snapshot` both need writing. When
        it fails, everything taken is put back to go with the next write (the error path's, say).
        """
        if self._deferred_snapshot is not None and snapshot is not None:
            await self._apply((), None)
        released = self._release(snapshot) if snapshot is not None else []
        deferred, self._deferred = self._deferred, []
        pending, self._deferred_snapshot = self._deferred_snapshot, None
        batch = [*deferred, *_flat(released), *writes] if released else [*deferred, *writes]
        saved = pending if pending is not None else snapshot
        try:
            with store_write(self.store, self.run_id, batch, saved) as write:
                if self._write_step is not None:
                    write.written(await self._write_step(self.run_id, batch, saved), sealed_size)
                else:
                    await write_records(self.store, batch, snapshot=saved, own=self._own_batch)
                    write.written()
        except BaseException as error:
            if isinstance(error, Exception):
                self.failed = error
            self._deferred[:0] = deferred
            self._deferred_snapshot = pending
            self._held[:0] = released
            raise
        if pending is not None:
            self._unannounced.append(pending)
        if snapshot is not None:
            self._unannounced.append(snapshot)

    async def _journal(
        self,
        ctx: RunContext[Any],
        writes: Sequence[StepWrite],
        snapshot: ContinuableSnapshot | None,
        *,
        new_call: bool,
    ) -> list[StepWrite]:
        """`snapshot`, the completions it releases, then `writes`: one durable operation each."""
        if snapshot is not None:
            released = self._release(snapshot)
            try:
                await self._operations.journal_snapshot(ctx, snapshot)
                self._unannounced.append(snapshot)
                while released:
                    for write in released[0]:
                        await self._operations.journal_write(ctx, write)
                    released.pop(0)
            except BaseException:
                self._held[:0] = released
                raise
        return [await self._operations.journal_write(ctx, write, new_call=new_call) for write in writes]

    async def _announce(self, ctx: RunContext[Any]) -> None:
        """Emit `SnapshotSaved` for every snapshot written since the last announcement, in order."""
        while self._unannounced:
            await announce_snapshot(ctx, self._unannounced.pop(0))

    def _arm_timer(self) -> bool:
        """Make sure deferred writes are flushed within `DEFERRED_WRITE_DELAY`; False when that cannot
        be scheduled (no asyncio loop)."""
        if self._due is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return False
            self._due = due = loop.time() + DEFERRED_WRITE_DELAY
            if self._timer is None or self._timer_loop is not loop:
                self._schedule(loop, due)
            # else the pending timer is due before `due` (it was set for an earlier deferral) and
            # waits on until `due` when it fires
        return True

    def _schedule(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._timer = loop.call_at(when, self._flush_soon)
        self._timer_when = when
        self._timer_loop = loop

    def _flush_soon(self) -> None:
        self._timer = None
        due = self._due
        if due is None:  # written meanwhile
            return
        if due > self._timer_when:  # deferred after the write that took what this timer was set for
            self._schedule(asyncio.get_running_loop(), due)
            return
        self._due = None
        if self._deferred or self._deferred_snapshot is not None:
            task = asyncio.get_running_loop().create_task(self._flush_in_background())
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _flush_in_background(self) -> None:
        async with self._lock:
            pending = len(self._deferred) + (self._deferred_snapshot is not None)
            if not pending:
                return
            try:
                await self._apply((), None)
            except Exception as error:
                logger.warning(
                    "StepPersistence could not write %d record(s) of run %r yet (%s: %s); the run's next write retries",
                    pending,
                    self.run_id,
                    type(error).__name__,
                    error,
                )


def _flat(completions: list[_Completion]) -> list[StepWrite]:
    """The entries and events of `completions`, in order."""
    return [write for completion in completions for write in completion]


def _answered(messages: Sequence[ModelMessage], calls: set[str]) -> set[str]:
    """Those of `calls` that a request in `messages` answers (a tool return or a retry prompt)."""
    found: set[str] = set()
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                call_id: object = getattr(part, 'tool_call_id', None)
                if isinstance(call_id, str) and call_id in calls:
                    found.add(call_id)
            if len(found) == len(calls):
                break
    return found
