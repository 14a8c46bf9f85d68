"""The port: the I/O a backend implements for the engine.

A port carries out the operations of `stepcore.engine._ops`, each by a method of the same name
taking the open transaction (whatever the port's `transaction()` yields: a connection, a cursor, a
set of held locks) and the operation. The engine decides what to ask and in which order; a port
only answers.

Ports come in two kinds:

- `SyncPort`: blocking I/O (SQLite, files, process memory). The engine runs a whole write or read
  on the port's thread in one hand-off (`call`), including the encoding of new messages, so the
  event loop only waits for the result.
- `AsyncPort`: native async I/O (network databases). Its methods are coroutines.

`transaction(runs)` opens one atomic write: a database transaction where the backend has them,
else whatever makes the writes to those runs exclusive (a lock) with the writes made in the order
the engine asks. Leaving it normally commits; leaving it with an exception rolls back (or, without
transactions, leaves what was written). `reading(run_id)` opens a consistent read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, nullcontext
from typing import Any, ClassVar, Final, TypeVar

from stepcore.backend_io.worker import WorkerThread
from stepcore.engine import _ops as ops

__all__ = ('AsyncPort', 'Port', 'SyncPort', 'check_text')

T = TypeVar('T')


def check_text(value: object, what: str) -> str:
    """`value` when it is a non-empty string without NUL characters; `ValueError` naming it otherwise."""
    if not isinstance(value, str) or not value or '\x00' in value:
        raise ValueError(f'{what} {value!r} cannot be stored: use a non-empty string without NUL characters')
    return value


class Port:
    """The operations every port carries out (see `stepcore.engine._ops` for what each one answers).

    A `SyncPort` implements them as plain methods, an `AsyncPort` as coroutines.
    """

    name: ClassVar[str] = 'store'
    """How errors and warnings name this kind of store."""

    fault_hook: Callable[[str], None] | None = None
    """Called at every write boundary with its name (see `stepcore.engine.faults`); `None` in use."""

    def boundary(self, name: str) -> None:
        """Mark a write boundary: the engine's, between its writes, and a port's own inside one."""
        if self.fault_hook is not None:
            self.fault_hook(name)

    gapless_events: ClassVar[bool] = False
    """Whether the event seqs of a run never skip a number, even after a crash or a concurrent
    writer (`ops.PutEvents`): then a listing with a seq missing in the middle is damage. A port that
    takes a seq from a counter before its insert, outside a transaction, may leave gaps: False."""

    def describe(self) -> str:
        """Where this port's data lives, for messages (`'database runs.db'`)."""
        return self.name

    def damage_of(self, error: Exception) -> str | None:
        """What `error`, raised by the backend's driver while reading, says is damaged in the stored
        data (a malformed page, text that does not decode), or `None` when it is not about damage.

        The engine then raises `DamagedRecordError` naming the run it was reading, in place of the
        driver's error. The default knows no driver's errors.
        """
        return None

    def transient(self, error: Exception, *, write: bool) -> bool:
        """Whether `error` is a passing failure of the store (a timeout, a dropped connection, a
        failover, a transaction conflict), after which the same read (`write=False`) or the same
        write transaction, made again whole (`write=True`), is safe and may succeed.

        For a write, only a failure known to have stored nothing qualifies (a conflict, a deadlock,
        a lock not granted in time): a connection lost while the commit was on its way may have
        stored it. The engine then makes the call again with growing random waits
        (`stepcore.engine._retry`). The default knows no driver's errors: nothing is retried.
        """
        return False

    def check_run_id(self, run_id: object) -> str:
        """`run_id` when this backend can store it; `ValueError` saying what to use otherwise."""
        return check_text(run_id, 'run_id')

    def insert_run(self, tx: Any, op: ops.InsertRun) -> ops.RunRow | None | Awaitable[ops.RunRow | None]:
        raise NotImplementedError(f'{type(self).__name__} does not implement insert_run')

    def get_run(self, tx: Any, op: ops.GetRun) -> ops.RunRow | None | Awaitable[ops.RunRow | None]:
        raise NotImplementedError(f'{type(self).__name__} does not implement get_run')

    def list_runs(self, tx: Any, op: ops.ListRuns) -> Sequence[ops.RunRow] | Awaitable[Sequence[ops.RunRow]]:
        raise NotImplementedError(f'{type(self).__name__} does not implement list_runs')

    def list_run_ids(self, tx: Any, op: ops.ListRunIds) -> Sequence[str] | Awaitable[Sequence[str]]:
        raise NotImplementedError(f'{type(self).__name__} does not implement list_run_ids')

    def delete_run(self, tx: Any, op: ops.DeleteRun) -> bool | Awaitable[bool]:
        raise NotImplementedError(f'{type(self).__name__} does not implement delete_run')

    def put_events(self, tx: Any, op: ops.PutEvents) -> None | Awaitable[None]:
        raise NotImplementedError(f'{type(self).__name__} does not implement put_events')

    def list_events(self, tx: Any, op: ops.ListEvents) -> Sequence[ops.EventRow] | Awaitable[Sequence[ops.EventRow]]:
        raise NotImplementedError(f'{type(self).__name__} does not implement list_events')

    def put_effects(self, tx: Any, op: ops.PutEffects) -> None | Awaitable[None]:
        raise NotImplementedError(f'{type(self).__name__} does not implement put_effects')

    def list_effects(
        self, tx: Any, op: ops.ListEffects
    ) -> Sequence[ops.EffectRow] | int | Awaitable[Sequence[ops.EffectRow] | int]:
        raise NotImplementedError(f'{type(self).__name__} does not implement list_effects')

    def snapshot_key_applied(self, tx: Any, op: ops.SnapshotKeyApplied) -> bool | Awaitable[bool]:
        raise NotImplementedError(f'{type(self).__name__} does not implement snapshot_key_applied')

    def node_exists(self, tx: Any, op: ops.NodeExists) -> bool | Awaitable[bool]:
        raise NotImplementedError(f'{type(self).__name__} does not implement node_exists')

    def snapshot_states(
        self, tx: Any, op: ops.SnapshotStates
    ) -> Sequence[tuple[int, str]] | tuple[int, int, int, int] | Awaitable[Any]:
        raise NotImplementedError(f'{type(self).__name__} does not implement snapshot_states')

    def put_snapshot(self, tx: Any, op: ops.PutSnapshot) -> Sequence[int] | Awaitable[Sequence[int]]:
        raise NotImplementedError(f'{type(self).__name__} does not implement put_snapshot')

    def delete_snapshots(self, tx: Any, op: ops.DeleteSnapshots) -> None | Awaitable[None]:
        raise NotImplementedError(f'{type(self).__name__} does not implement delete_snapshots')

    def list_snapshots(
        self, tx: Any, op: ops.ListSnapshots
    ) -> Sequence[ops.SnapshotRow] | Awaitable[Sequence[ops.SnapshotRow]]:
        raise NotImplementedError(f'{type(self).__name__} does not implement list_snapshots')

    def get_nodes(self, tx: Any, op: ops.GetNodes) -> Mapping[int, ops.Node] | Awaitable[Mapping[int, ops.Node]]:
        raise NotImplementedError(f'{type(self).__name__} does not implement get_nodes')

    def store_identity(self, tx: Any, op: ops.StoreIdentity) -> str | Awaitable[str]:
        raise NotImplementedError(f'{type(self).__name__} does not implement store_identity')

    def store_location(self, tx: Any, op: ops.StoreLocation) -> str | Awaitable[str]:
        """Where the store's data lives (see `ops.StoreLocation`); `SyncPort` and `AsyncPort` answer `describe()`."""
        raise NotImplementedError(f'{type(self).__name__} does not implement store_location')

    # Leases: only for a store that declares the feature `leases` (see `stepcore.engine._ops`).

    def get_lease(self, tx: Any, op: ops.GetLease) -> ops.LeaseRead | Awaitable[ops.LeaseRead]:
        raise NotImplementedError(f'{type(self).__name__} does not implement get_lease')

    def swap_lease(self, tx: Any, op: ops.SwapLease) -> ops.LeaseSwap | Awaitable[ops.LeaseSwap]:
        raise NotImplementedError(f'{type(self).__name__} does not implement swap_lease')

    def list_leases(
        self, tx: Any, op: ops.ListLeases
    ) -> tuple[Sequence[ops.LeaseRow], float] | Awaitable[tuple[Sequence[ops.LeaseRow], float]]:
        raise NotImplementedError(f'{type(self).__name__} does not implement list_leases')

    def get_lease_start(self, tx: Any, op: ops.GetLeaseStart) -> bytes | None | Awaitable[bytes | None]:
        raise NotImplementedError(f'{type(self).__name__} does not implement get_lease_start')

    def check_lease(self, tx: Any, op: ops.CheckLease) -> None | Awaitable[None]:
        raise NotImplementedError(f'{type(self).__name__} does not implement check_lease')

    # A step's whole write in one call: only for a port that sets `fused_steps`.

    fused_steps: ClassVar[bool] = False
    """Whether the port carries out `WriteStep` itself, in one call inside its transaction (a port
    with transactions, to spare a step the dispatch of each operation); else the engine sends the
    step's operations one at a time (`stepcore.engine._plans.write_plan`)."""

    def write_step(self, tx: Any, op: ops.WriteStep) -> Sequence[int] | None | Awaitable[Sequence[int] | None]:
        raise NotImplementedError(f'{type(self).__name__} does not implement write_step (fused_steps is False)')


_STEP_OPERATIONS = (
    'check_lease',
    'snapshot_key_applied',
    'node_exists',
    'snapshot_states',
    'put_snapshot',
    'delete_snapshots',
    'put_effects',
    'put_events',
)
"""The operations a `WriteStep` stands for."""


def fuses_steps(port: Port) -> bool:
    """Whether `port` is sent a step's write whole (`WriteStep`): it sets `fused_steps`, and no class
    below the one defining its `write_step` redefines an operation the step stands for (a subclass
    changing how events are stored, say, is sent the operations one by one, so its change holds)."""
    cls = type(port)
    if not cls.fused_steps:
        return False
    below: list[type] = []
    for part in cls.__mro__:
        if 'write_step' in vars(part):
            break
        below.append(part)
    return not any(name in vars(part) for part in below for name in _STEP_OPERATIONS)


class SyncPort(Port):
    """A port doing blocking I/O, on a thread of its own (or inline, when `worker` is `None`)."""

    inline_writes: bool = False
    """Whether a short write may run on the event loop's thread when the port's thread is idle
    (`try_inline`): true for a port whose commit does not wait for the disk (no fsync) and whose
    code raises `stepcore.backend_io.worker.WouldBlock` where it would otherwise wait for a lock held by
    another thread or process (see `stepcore.backend_io.worker.running_inline`)."""

    group_commit: ClassVar[bool] = False
    """Whether `savepoint` can isolate one write inside a transaction, so the engine may carry out
    the writes waiting for the port's thread in one transaction (`stepcore.engine._group`)."""

    def __init__(self, *, worker: WorkerThread | None = None) -> None:
        self.worker = worker

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` where this port's I/O runs: on its worker thread, or inline without one."""
        if self.worker is None:
            return fn(*args)
        return await self.worker.run(fn, *args)

    def try_inline(self, fn: Callable[..., T], *args: Any) -> tuple[bool, T | None]:
        """`(True, fn(*args))` run now on the calling thread when the port's thread is idle, else
        `(False, None)` (see `WorkerThread.try_inline`); a port without a thread always runs it."""
        if self.worker is None:
            return True, fn(*args)
        return self.worker.try_inline(fn, *args)

    async def wait_idle(self) -> bool:
        """Wait until the port's thread has no call queued or running; `False` at once when it has
        none (or the port has no thread)."""
        return False if self.worker is None else await self.worker.wait_idle()

    def transaction(self, runs: Sequence[str]) -> AbstractContextManager[Any]:
        """One atomic write to `runs` (see the module docstring); yields what the methods take as `tx`."""
        return _NO_TRANSACTION

    def reading(self, run_id: str | None) -> AbstractContextManager[Any]:
        """A consistent read of one run (`None`: of the run list); yields what the methods take as `tx`."""
        return _NO_TRANSACTION

    def savepoint(self, tx: Any) -> AbstractContextManager[Any]:
        """Inside `transaction()`: a part that a failure rolls back alone (with `group_commit`)."""
        raise NotImplementedError(f'{type(self).__name__} does not group writes (group_commit is False)')

    def run(self, tx: Any, op: ops.Op) -> Any:
        """Carry out one operation."""
        return getattr(self, op.method)(tx, op)

    def check_integrity(self, tx: Any, op: ops.CheckIntegrity) -> Sequence[str] | None:
        """The backend's own integrity check (see `ops.CheckIntegrity`); `None`: it has none."""
        return None

    def store_location(self, tx: Any, op: ops.StoreLocation) -> str:
        """Where the store's data lives (see `ops.StoreLocation`): `describe()` by default."""
        return self.describe()

    def close(self) -> None:
        """Release what the port opened (called on its thread)."""
        if self.worker is not None:
            self.worker.close()


class AsyncPort(Port):
    """A port doing native async I/O: its operation methods are coroutines."""

    def transaction(self, runs: Sequence[str]) -> AbstractAsyncContextManager[Any]:
        """One atomic write to `runs` (see the module docstring); yields what the methods take as `tx`."""
        return _anothing()

    def reading(self, run_id: str | None) -> AbstractAsyncContextManager[Any]:
        """A consistent read of one run (`None`: of the run list); yields what the methods take as `tx`."""
        return _anothing()

    async def run(self, tx: Any, op: ops.Op) -> Any:
        """Carry out one operation."""
        return await getattr(self, op.method)(tx, op)

    async def check_integrity(self, tx: Any, op: ops.CheckIntegrity) -> Sequence[str] | None:
        """The backend's own integrity check (see `ops.CheckIntegrity`); `None`: it has none."""
        return None

    async def store_location(self, tx: Any, op: ops.StoreLocation) -> str:
        """Where the store's data lives (see `ops.StoreLocation`): `describe()` by default."""
        return self.describe()

    async def run_group(self, tx: Any, ops: Sequence[ops.Op]) -> list[Any]:
        """Carry out operations that do not depend on each other's answers, in order.

        A port may send them in one round trip (a pipeline); the default awaits each in turn.
        """
        return [await self.run(tx, op) for op in ops]

    async def close(self) -> None:
        """Release what the port opened."""
        return None


_NO_TRANSACTION: Final = nullcontext()
"""What a port without transactions opens: nothing (reentrant, so one serves every write)."""


@asynccontextmanager
async def _anothing() -> AsyncIterator[None]:
    yield None
