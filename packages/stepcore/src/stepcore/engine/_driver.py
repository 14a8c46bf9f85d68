"""The driver: runs the engine's plans on a port, in transactions, and names the store in its errors.

A plan (`_plans.py`) yields operations (a step's write may come whole instead, `ops.WriteStep`); the
driver sends each to the port and its answer back, on the port's thread for a `SyncPort` (in one
hand-off with the commit, or inline on the event loop for a short write when the port allows it,
or grouped with other writes when the port groups them), or awaited for an `AsyncPort`. It marks
the engine's write boundaries for fault injection and adds a note naming the store to an error of
the backend's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeAlias, TypeVar, cast

from stepcore.common.damage import UNREADABLE, DamagedRecordError
from stepcore.engine._group import NOT_PREPARED, WriteGroups
from stepcore.engine._ops import Op, WriteStep
from stepcore.engine._plans import Fenced, KeyConflict, Plan, StaleHistory, write_plan
from stepcore.engine._port import AsyncPort, Port, SyncPort, fuses_steps
from stepcore.engine._retry import retrying

__all__ = (
    'INLINE_ATTEMPTS',
    'INLINE_NEW_MESSAGES',
    'INLINE_RECORDS',
    'NEEDS_WALK',
    'Driver',
    'NeedsWalk',
    'drive_async',
    'drive_sync',
    'single',
)

T = TypeVar('T')

INLINE_RECORDS: Final = 64
"""A write of at most this many events and ledger entries may be written inline (see below)."""
INLINE_ATTEMPTS: Final = 4
"""How often a short write finds the port's thread busy, waits for it and tries inline again before
it queues for the thread."""
INLINE_NEW_MESSAGES: Final = 8
"""A snapshot save with at most this many messages new to the run's last save may be written
inline on the event loop (`SyncPort.inline_writes`); a longer one goes to the port's thread."""
_OURS = (ValueError, LookupError, TypeError, RuntimeError, NotImplementedError, KeyConflict, StaleHistory, Fenced)
"""Errors the engine and the contract raise themselves: they already say what is wrong."""


class NeedsWalk:
    """A save whose new messages hold media: they go to the media store from the event loop first."""


NEEDS_WALK: Final = NeedsWalk()


def drive_sync(port: SyncPort, tx: Any, plan: Plan[T]) -> T:
    """Carry out a plan on a blocking port: each operation sent to the port, its answer back."""
    answer: Any = None
    while True:
        try:
            step = plan.send(answer)
        except StopIteration as done:
            return cast(T, done.value)
        if isinstance(step, tuple):
            answer = [port.run(tx, op) for op in step]
            continue
        if step.writes:
            port.boundary(step.method)
        answer = port.run(tx, step)


async def drive_async(port: AsyncPort, tx: Any, plan: Plan[T]) -> T:
    """Carry out a plan on an async port; a group of independent reads goes to `run_group`."""
    answer: Any = None
    while True:
        try:
            step = plan.send(answer)
        except StopIteration as done:
            return cast(T, done.value)
        if isinstance(step, tuple):
            answer = await port.run_group(tx, step)
            continue
        if step.writes:
            port.boundary(step.method)
        answer = await port.run(tx, step)


Work: TypeAlias = 'Plan[T] | WriteStep'
"""What a write transaction carries out: a plan, or a step's write (`WriteStep`, which answers the
snapshot's new node ids), sent whole to a port with `fused_steps` and as `write_plan` to the others."""


def carry_out(port: SyncPort, tx: Any, work: Work[T], fused: bool) -> T:
    """`work` on a blocking port, inside its transaction `tx`; `fused`: `fuses_steps(port)`."""
    if type(work) is WriteStep:
        if fused:
            if port.fault_hook is not None:
                port.fault_hook('write_step')
            return cast(T, port.write_step(tx, work))
        return cast(T, drive_sync(port, tx, write_plan(work)))
    return drive_sync(port, tx, cast(Plan[T], work))


async def carry_out_async(port: AsyncPort, tx: Any, work: Work[T], fused: bool) -> T:
    """`work` on an async port, inside its transaction `tx`; `fused`: `fuses_steps(port)`."""
    if type(work) is WriteStep:
        if fused:
            if port.fault_hook is not None:
                port.fault_hook('write_step')
            return cast(T, await cast(Awaitable[Any], port.write_step(tx, work)))
        return cast(T, await drive_async(port, tx, write_plan(work)))
    return await drive_async(port, tx, cast(Plan[T], work))


def single(op: Op) -> Plan[Any]:
    """A plan of one operation."""
    return (yield op)


class Driver:
    """Runs plans on one port for the store named `owner` (see the module docstring)."""

    def __init__(self, port: Port, owner: str) -> None:
        if not isinstance(port, SyncPort | AsyncPort):
            raise TypeError(f'{owner} needs a SyncPort or an AsyncPort, got {type(port).__name__}')
        self.port = port
        self.owner = owner
        self.fused = fuses_steps(port)
        """Whether a step's write goes to the port whole (see `fuses_steps`)."""
        self._groups = WriteGroups(port) if isinstance(port, SyncPort) and port.group_commit else None
        self.reached = False
        """Whether the store ever answered: until it has, a failure is never called passing (a
        wrong address, a server that is down, fails at once rather than after a minute of tries)."""

    async def transact(
        self,
        runs: Sequence[str],
        make_plan: Callable[[], Work[T]],
        prepare: Callable[[], bool] | None = None,
        *,
        short: bool = False,
        retry: bool = True,
    ) -> T | NeedsWalk:
        """Run a write plan in one transaction; `NEEDS_WALK` when `prepare()` says media must go first.

        A transaction that fails in a way the port calls passing and harmless to make again
        (`Port.transient`) is made again whole, from a fresh plan, once the store has answered
        before (`reached`), unless `retry` is false (a lease swap: its caller tries again on its
        own schedule, and a claim must never wait).
        """
        port = self.port
        try:  # the common case first, at the cost of one call
            result = await self._transact(runs, make_plan, prepare, short=short)
            self.reached = True
            return result
        except Exception as error:
            if not retry or not self.reached or not port.transient(error, write=True):
                raise
        return await retrying(
            lambda: self._transact(runs, make_plan, prepare, short=short),
            lambda error: port.transient(error, write=True),
            failed=1,
        )

    async def _transact(
        self,
        runs: Sequence[str],
        make_plan: Callable[[], Work[T]],
        prepare: Callable[[], bool] | None,
        *,
        short: bool,
    ) -> T | NeedsWalk:
        """One attempt of `transact`.

        On a `SyncPort`, `prepare` (finding and encoding a save's new messages), the plan and the
        commit run together: inline on the event loop when the write is `short`, the port allows
        it and its thread is idle (a step's records and a few new messages: no hand-off, no
        contention for the GIL between two threads), else on the port's thread in one hand-off.
        """
        port, fused = self.port, self.fused
        try:
            if isinstance(port, SyncPort):

                def job() -> T | NeedsWalk:
                    if prepare is not None and not prepare():
                        return NEEDS_WALK
                    with port.transaction(runs) as tx:
                        result = carry_out(port, tx, make_plan(), fused)
                        if port.fault_hook is not None:
                            port.fault_hook('commit')
                    if port.fault_hook is not None:
                        port.fault_hook('committed')
                    return result

                if short and port.inline_writes:
                    for _ in range(INLINE_ATTEMPTS):
                        done, result = port.try_inline(job)
                        if done:
                            return cast(T | NeedsWalk, result)
                        # A port that cannot group writes gains nothing by queueing behind its busy
                        # thread, and under many runs every write would then queue behind the one
                        # before: it waits for the thread to be idle and writes inline. One that can
                        # group them queues, and its thread commits the queued writes together.
                        if port.group_commit or not await port.wait_idle():
                            break
                if self._groups is not None and port.fault_hook is None:
                    # under fault injection each write keeps a transaction of its own, so a fault
                    # stops exactly the write it is aimed at
                    outcome = await self._groups.write(
                        runs, prepare, lambda tx: carry_out(port, tx, make_plan(), fused)
                    )
                    return NEEDS_WALK if outcome is NOT_PREPARED else cast(T, outcome)
                return await port.call(job)
            assert isinstance(port, AsyncPort)
            if prepare is not None and not prepare():
                return NEEDS_WALK
            async with port.transaction(runs) as tx:
                result = await carry_out_async(port, tx, make_plan(), fused)
                port.boundary('commit')
            port.boundary('committed')
            return result
        except Exception as error:
            self.note(error, f'writing run {", ".join(map(repr, runs))}')
            raise

    async def read(self, run_id: str | None, make_plan: Callable[[], Plan[T]]) -> T:
        """Carry out a read plan (made afresh for each attempt: a passing failure is tried again)."""
        port = self.port
        try:  # the common case first, at the cost of one call
            result = await self._read(run_id, make_plan())
            self.reached = True
            return result
        except Exception as error:
            if not self.reached or not port.transient(error, write=False):
                raise
        return await retrying(
            lambda: self._read(run_id, make_plan()), lambda error: port.transient(error, write=False), failed=1
        )

    async def _read(self, run_id: str | None, plan: Plan[T]) -> T:
        port = self.port
        try:
            if isinstance(port, SyncPort):

                def job() -> T:
                    with port.reading(run_id) as tx:
                        return drive_sync(port, tx, plan)

                return await port.call(job)
            assert isinstance(port, AsyncPort)
            async with port.reading(run_id) as tx:
                return await drive_async(port, tx, plan)
        except Exception as error:
            reason = None if isinstance(error, DamagedRecordError) else port.damage_of(error)
            if reason is not None:
                raise DamagedRecordError(
                    run_id=run_id,
                    record='the run list' if run_id is None else 'stored data',
                    where=port.describe(),
                    reason=reason,
                    kind=UNREADABLE,
                ) from error
            self.note(error, 'listing runs' if run_id is None else f'reading run {run_id!r}')
            raise

    def note(self, error: Exception, action: str) -> None:
        """Add a note naming the store and what it was doing to an error of the backend's own (a
        driver's or the operating system's), so it never reaches a caller without that context."""
        if not isinstance(error, _OURS):
            error.add_note(f'{self.owner} on {self.port.describe()}, {action}')

    async def write_op(self, runs: Sequence[str], op: Op, *, retry: bool = True) -> Any:
        """Run one write operation in a transaction of its own."""
        return await self.transact(runs, lambda: single(op), retry=retry)

    async def read_op(self, run_id: str | None, op: Op) -> Any:
        """Carry out one read operation."""
        return await self.read(run_id, lambda: single(op))

    # -- checks and encoding ------------------------------------------------------------------

    async def close(self) -> None:
        """Release what the port opened (on its thread, for a `SyncPort`)."""
        port = self.port
        if isinstance(port, SyncPort):
            await port.call(port.close)
        else:
            assert isinstance(port, AsyncPort)
            await port.close()
