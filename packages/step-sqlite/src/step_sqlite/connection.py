"""One SQLite connection shared by the stores of a database, used from worker threads.

Every store call runs its SQL on the connection's own worker thread (`stepcore.backend.WorkerThread`) so the event
loop never waits on the disk, and a per-connection lock keeps calls from interleaving inside one
connection. A short write may instead run on the event loop's thread when the worker is idle
(`Database.try_inline`), only where it waits for nothing: no fsync at commit, and neither the
connection lock nor another connection's write lock is waited for. Writes run in `BEGIN IMMEDIATE`
transactions: the write lock is taken up front, so two processes writing the same file wait for each
other (up to the busy timeout) instead of failing on a lock upgrade.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from stepcore.backend import (
    WorkerThread,
    WouldBlock,
    running_inline,
)

__all__ = ('Database', 'Guard', 'Synchronous', 'check_shared_connection', 'fullfsync_pragmas', 'write_transaction')

T = TypeVar('T')

logger = logging.getLogger(__name__)

Synchronous = Literal['OFF', 'NORMAL', 'FULL', 'EXTRA']

# Settings of a connection the store opens itself (a shared connection is left as configured).
PAGE_SIZE = 2048
"""Page size of a database the store creates: small transactions write whole pages to the WAL, and
2 KiB pages halve that traffic against SQLite's 4 KiB default while packing message rows as well."""
WAL_AUTOCHECKPOINT_PAGES = 1024
"""SQLite's own checkpoint, inside the commit that takes the WAL past this many pages (2 MiB): a
safety net behind `CHECKPOINT_EVERY_WRITES`, reached only by very large writes."""
CHECKPOINT_EVERY_WRITES = 16
"""After this many write calls, a passive checkpoint runs on the worker thread once the call's
result is handed back, so its fsyncs are not waited for by a commit the caller awaits (about
512 KiB of WAL at a persisted agent's write sizes)."""
JOURNAL_SIZE_LIMIT = 512 * 1024
"""Truncate the WAL back to this size after a checkpoint, so it does not keep its high-water size."""
_SYNCHRONOUS = ('OFF', 'NORMAL', 'FULL', 'EXTRA')


class Guard:
    """The lock and worker thread of one connection; shared by every store object using it."""

    __slots__ = ('__weakref__', 'checkpoint_queued', 'closed', 'connection', 'lock', 'worker', 'writes')

    def __init__(self, connection: sqlite3.Connection | None) -> None:
        self.connection = connection
        self.lock = threading.Lock()
        self.closed = False
        """Set when the store that opened the connection closed it."""
        self.worker = WorkerThread('step-sqlite')
        """The connection's own thread (calls on one connection run one at a time anyway)."""
        self.writes = 0
        """Write calls since the last checkpoint this module ran (connections the store opened)."""
        self.checkpoint_queued = False


# sqlite3.Connection cannot be weakly referenced, so guards are found by id(); a guard holds its
# connection, so the id cannot be reused while the guard is alive.
_GUARDS: weakref.WeakValueDictionary[int, Guard] = weakref.WeakValueDictionary()
_GUARDS_LOCK = threading.Lock()


def _guard_for(connection: sqlite3.Connection) -> Guard:
    with _GUARDS_LOCK:
        guard = _GUARDS.get(id(connection))
        if guard is None or guard.connection is not connection:
            guard = Guard(connection)
            _GUARDS[id(connection)] = guard
        return guard


def check_shared_connection(connection: object, *, owner: str) -> sqlite3.Connection:
    """Check that a user-supplied connection is open and usable from worker threads."""
    if not isinstance(connection, sqlite3.Connection):
        raise TypeError(f'{owner}(connection=...) needs a sqlite3.Connection, got {type(connection).__name__}')
    problem: list[BaseException] = []

    def probe() -> None:
        try:
            connection.execute('SELECT 1').fetchone()
        except BaseException as exc:
            problem.append(exc)

    thread = threading.Thread(target=probe, name='step-sqlite-connection-check')
    thread.start()
    thread.join()
    if problem:
        error = problem[0]
        if isinstance(error, sqlite3.ProgrammingError) and 'thread' in str(error):
            raise ValueError(
                f'{owner}(connection=...) got a connection opened with check_same_thread=True; store calls run '
                'on worker threads, so open it with sqlite3.connect(..., check_same_thread=False)'
            ) from error
        raise ValueError(f'{owner}(connection=...) got a connection that cannot be used: {error}') from error
    return connection


class write_transaction:
    """A write transaction that takes the database write lock immediately.

    On a shared connection that already has a transaction open, the work joins it through a
    savepoint and is committed (or rolled back) with the caller's transaction. Running inline on
    the event loop (`stepcore.backend.running_inline`) with the connection's `busy_timeout` given,
    it does not wait for another connection's write lock: it raises `WouldBlock` instead.

    A class rather than a generator context manager: every step's write opens one.
    """

    __slots__ = ('busy_timeout', 'connection', 'nested')

    def __init__(self, connection: sqlite3.Connection, *, busy_timeout: float | None = None) -> None:
        self.connection = connection
        self.busy_timeout = busy_timeout
        self.nested = False

    def __enter__(self) -> sqlite3.Connection:
        connection = self.connection
        if connection.in_transaction:
            connection.execute('SAVEPOINT step_sqlite')
            self.nested = True
        elif self.busy_timeout is not None and running_inline():
            _begin_without_waiting(connection, self.busy_timeout)
        else:
            connection.execute('BEGIN IMMEDIATE')
        return connection

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        connection = self.connection
        if self.nested:
            if kind is not None:
                connection.execute('ROLLBACK TO step_sqlite')
            connection.execute('RELEASE step_sqlite')
        elif kind is not None:
            if connection.in_transaction:
                connection.rollback()
        else:
            connection.commit()


def _begin_without_waiting(connection: sqlite3.Connection, busy_timeout: float) -> None:
    connection.execute('PRAGMA busy_timeout=0')
    try:
        connection.execute('BEGIN IMMEDIATE')
    except sqlite3.OperationalError as exc:
        if 'locked' in str(exc) or 'busy' in str(exc):
            raise WouldBlock from exc
        raise
    finally:
        connection.execute(f'PRAGMA busy_timeout={int(busy_timeout * 1000)}')


def _while_locked(action: Callable[[], T], timeout: float) -> T:
    """Run `action`, retrying for up to `timeout` seconds while SQLite reports the database locked.

    Switching to (or confirming) WAL mode can fail with "database is locked" without waiting on the
    busy timeout, when another process holds the lock at that moment (opening a store while
    another process writes to the same file); it succeeds a moment later.
    """
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if 'locked' not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _create_owner_only(path: Path) -> None:
    """Create an empty database file readable by its owner only (0600), unless it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)


def fullfsync_pragmas(synchronous: Synchronous, full_fsync: bool | None) -> list[str]:
    """The `fullfsync` PRAGMAs a connection the store opens gets, chosen when it is opened.

    On macOS `fsync(2)` leaves the data in the drive's cache, where a power loss can lose it or
    write it out of order; SQLite flushes with `F_FULLFSYNC` only when `PRAGMA fullfsync` (every
    sync: the commits of `FULL` and `EXTRA`) and `PRAGMA checkpoint_fullfsync` (the checkpoints
    that copy the WAL into the database, the only syncs of `NORMAL`) are on, and both are off by
    default. So on macOS, whenever `synchronous` syncs at all (not `OFF`), both are turned on,
    unless `full_fsync=False` trades that off for speed; `full_fsync=True` turns them on anywhere
    (SQLite ignores them where the system has no `F_FULLFSYNC`). Elsewhere, by default, nothing is
    set: Linux's `fsync` already reaches the disk.
    """
    if full_fsync is None:
        if sys.platform != 'darwin' or synchronous == 'OFF':
            return []
        full_fsync = True
    value = 'ON' if full_fsync else 'OFF'
    return [f'PRAGMA fullfsync={value}', f'PRAGMA checkpoint_fullfsync={value}']


def _check_options(timeout: float, synchronous: Synchronous, full_fsync: bool | None = None) -> None:
    if synchronous not in _SYNCHRONOUS:
        raise ValueError(f'synchronous={synchronous!r} is not a SQLite synchronous level: use one of {_SYNCHRONOUS}')
    if full_fsync is not None and not isinstance(cast(object, full_fsync), bool):
        raise ValueError(f'full_fsync={full_fsync!r} must be True, False or None (the platform default)')
    if isinstance(timeout, bool) or not isinstance(cast(object, timeout), int | float) or timeout < 0:
        raise ValueError(f'timeout={timeout!r} must be a number of seconds >= 0')


class Database:
    """A connection (opened lazily on a worker thread, or supplied) plus its lock.

    `setup` callbacks (schema creation and migration) run once, under the lock, before the first
    call that needs them.
    """

    def __init__(
        self,
        guard: Guard,
        *,
        owner: str,
        path: str | None,
        owned: bool,
        describe: str,
        timeout: float = 30.0,
        synchronous: Synchronous = 'NORMAL',
        full_fsync: bool | None = None,
    ) -> None:
        """A handle on the connection `guard` holds (open or to be opened at `path`); `Database.open`
        makes one from a path or a connection, `share` another on the same connection."""
        _check_options(timeout, synchronous, full_fsync)
        self.owner = owner
        self.timeout = float(timeout)
        self.synchronous: Synchronous = synchronous
        self.full_fsync = full_fsync
        """Whether the connection the store opens flushes with `F_FULLFSYNC` (see `fullfsync_pragmas`)."""
        self._setups: dict[str, Callable[[sqlite3.Connection], None]] = {}
        self._ready: set[str] = set()
        self.closed = False
        self.path = path
        self.owned = owned
        """Whether this handle opened the connection, and so closes it."""
        self._guard = guard
        self.describe = describe

    @classmethod
    def open(
        cls,
        database: str | os.PathLike[str] | None,
        connection: sqlite3.Connection | None,
        *,
        owner: str,
        timeout: float = 30.0,
        synchronous: Synchronous = 'NORMAL',
        full_fsync: bool | None = None,
    ) -> Database:
        """A handle on the database file `database` (its connection opened on first use, closed by
        `aclose`) or on the shared `connection` (never closed here): exactly one of them."""
        if (database is None) == (connection is None):
            raise ValueError(
                f'{owner} needs exactly one of database= (a file path) or connection= (an open sqlite3.Connection)'
            )
        _check_options(timeout, synchronous, full_fsync)
        options: dict[str, Any] = {
            'owner': owner,
            'timeout': timeout,
            'synchronous': synchronous,
            'full_fsync': full_fsync,
        }
        if connection is not None:
            guard = _guard_for(check_shared_connection(connection, owner=owner))
            return cls(guard, path=None, owned=False, describe='the shared connection', **options)
        assert database is not None
        path = os.fspath(database)
        if not path:
            raise ValueError(f"{owner}(database='') needs a file path (or ':memory:')")
        return cls(Guard(None), path=path, owned=True, describe=f'database {path!r}', **options)

    @classmethod
    def given(
        cls,
        database: str | os.PathLike[str] | Database | None,
        connection: sqlite3.Connection | None,
        *,
        owner: str,
        timeout: float = 30.0,
        synchronous: Synchronous = 'NORMAL',
        full_fsync: bool | None = None,
    ) -> Database:
        """What a store's `database=` / `connection=` give it: a handle shared from another store's
        `Database` (never closed by the store), or `Database.open(...)`."""
        if not isinstance(database, Database):
            return cls.open(
                database, connection, owner=owner, timeout=timeout, synchronous=synchronous, full_fsync=full_fsync
            )
        if connection is not None:
            raise ValueError(f'{owner} takes a Database or connection=, not both')
        return database.share(owner)

    def add_setup(self, name: str, setup: Callable[[sqlite3.Connection], None]) -> None:
        """Register a schema callback to run (once) before the next call."""
        self._setups.setdefault(name, setup)

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work(connection)` on the connection's worker thread, holding the connection lock."""
        self._check_open()
        return await self._guard.worker.run(self._call, work)

    def try_inline(self, work: Callable[[sqlite3.Connection], T]) -> tuple[bool, T | None]:
        """`(True, work(connection))` run now on the calling thread when the connection is open,
        set up and idle; `(False, None)` otherwise (then use `run`)."""
        self._check_open()
        if self._guard.connection is None or len(self._ready) < len(self._setups):
            return False, None
        return self._guard.worker.try_inline(self._call, work)

    def _check_open(self) -> None:
        if self.closed or self._guard.closed:
            raise RuntimeError(f'{self.owner} on {self.describe} is closed: create a new store to use it again')

    def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        lock = self._guard.lock
        if not lock.acquire(blocking=not running_inline()):
            raise WouldBlock
        try:
            self._check_open()
            connection = self._connection()
            for name, setup in self._setups.items():
                if name not in self._ready:
                    setup(connection)
                    self._ready.add(name)
            changes = connection.total_changes
            result = work(connection)
            if self.owned and connection.total_changes != changes:
                self._count_write()
            return result
        finally:
            lock.release()

    def _count_write(self) -> None:
        """Note a write call; every `CHECKPOINT_EVERY_WRITES` queue a checkpoint behind it (lock held)."""
        guard = self._guard
        guard.writes += 1
        if guard.writes >= CHECKPOINT_EVERY_WRITES and not guard.checkpoint_queued:
            guard.checkpoint_queued = True
            guard.worker.enqueue(self._checkpoint)  # runs behind the call holding the lock now

    def _checkpoint(self) -> None:
        """Copy the WAL into the database file, between calls (PASSIVE: never waits for other connections)."""
        with self._guard.lock:
            guard = self._guard
            guard.checkpoint_queued = False
            connection = guard.connection
            if guard.closed or connection is None:
                return
            guard.writes = 0
            try:
                connection.execute('PRAGMA wal_checkpoint(PASSIVE)').fetchone()
            except sqlite3.Error as exc:
                # e.g. another process holds a lock: the next checkpoint, or SQLite's own, catches up
                logger.debug('passive checkpoint of %s skipped: %s', self.describe, exc)

    def _connection(self) -> sqlite3.Connection:
        connection = self._guard.connection
        if connection is not None:
            return connection
        assert self.path is not None
        uri = self.path.startswith('file:')
        if self.path != ':memory:' and not uri:
            _create_owner_only(Path(self.path))
        connection = sqlite3.connect(
            self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False, uri=uri
        )
        try:
            if connection.execute('PRAGMA page_count').fetchone()[0] == 0:
                connection.execute(f'PRAGMA page_size={PAGE_SIZE}')
            _while_locked(lambda: connection.execute('PRAGMA journal_mode=WAL').fetchone(), self.timeout)
            connection.execute(f'PRAGMA synchronous={self.synchronous}')
            for pragma in fullfsync_pragmas(self.synchronous, self.full_fsync):
                connection.execute(pragma)
            connection.execute(f'PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}')
            connection.execute(f'PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}')
        except BaseException:
            connection.close()
            raise
        self._guard.connection = connection
        return connection

    async def aclose(self) -> None:
        """Mark closed; close the connection when this object opened it."""
        await self._guard.worker.run(self._close)
        if self.owned:
            self._guard.worker.close()

    def _close(self) -> None:
        with self._guard.lock:
            if self.closed:
                return
            self.closed = True
            connection = self._guard.connection
            if self.owned:
                self._guard.closed = True
                self._guard.connection = None
                if connection is not None:
                    connection.close()

    def share(self, owner: str) -> Database:
        """Another handle on the same connection and lock (closing it never closes the connection)."""
        return Database(
            self._guard,
            owner=owner,
            path=self.path,
            owned=False,
            describe=self.describe,
            timeout=self.timeout,
            synchronous=self.synchronous,
            full_fsync=self.full_fsync,
        )
