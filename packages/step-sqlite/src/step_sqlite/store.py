"""`SqliteStepStore`: runs, events, snapshots and the tool-effect ledger in one SQLite database.

The store is the stepcore engine over `SqlitePort`, which answers the engine's operations with
SQL on the database's own connection and thread (`connection.py`).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final, TypeVar

from stepcore.backend import (
    AUTO,
    CHECKSUMS,
    DEFAULT_MEDIA_THRESHOLD_BYTES,
    ENCRYPTION,
    LEASES,
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
    Encryption,
    EngineStore,
    Fenced,
    KeyConflict,
    MediaStoreOption,
    SnapshotState,
    StaleHistory,
    SyncPort,
    check_media_store,
    event_window,
    ops,
    pruned_with,
)

from .connection import Database, Synchronous, write_transaction
from .harness import migrate_harness_database
from .media import SqliteMediaStore
from .records import pack_body, unpack_body
from .schema import IDENTITY, STEPS, SchemaDamaged, ensure_schema
from .schema import LEASES as LEASE_TABLES

__all__ = ('DEFAULT_MEDIA_STORE', 'SqlitePort', 'SqliteStepStore')

T = TypeVar('T')

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


DEFAULT_MEDIA_STORE: Final = AUTO
"""`media_store=` default, `'auto'`: a `SqliteMediaStore` on the same database (its `media` table)."""


def _micros(moment: datetime) -> int:
    """Microseconds since the epoch, for ordering."""
    return (moment - _EPOCH) // _MICROSECOND


def _text(body: object) -> str:
    """A body as the TEXT the `record` columns hold."""
    return body.decode() if isinstance(body, bytes) else str(body)


def _started(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


_RUN_COLUMNS = 'run_id, started_us, conversation_id, parent_run_id, CAST(record AS BLOB)'
_LEASE_COLUMNS = 'run_id, epoch, state, host, expires, body'
_SNAPSHOT_COLUMNS = 'run_id, state, head, length, CAST(record AS BLOB), seq'
_EFFECT_COLUMNS = 'run_id, tool_call_id, status, started_us, CAST(record AS BLOB)'
# `record` columns are read as bytes: text a damaged page no longer decodes is then one damaged
# record, found by the engine, rather than a driver error failing the whole listing.
_EVENT_SELECT = 'SELECT seq, idempotency_key, CAST(record AS BLOB) FROM events WHERE run_id = ?'
_DAMAGE_SIGNS = ('malformed', 'not a database', 'Could not decode', 'file is encrypted')
_SCHEMA_SIGNS = ('no such column', 'no such table')

_APPEND_EVENT = (
    'INSERT INTO events (run_id, seq, idempotency_key, record) '
    'SELECT ?, COALESCE(MAX(seq), 0) + 1, ?, ? FROM events WHERE run_id = ? '
    'ON CONFLICT DO NOTHING'
)
_UPSERT_EFFECT = (
    'INSERT INTO tool_effects (run_id, tool_call_id, status, started_us, record) '
    'VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, tool_call_id) DO UPDATE SET '
    'status = excluded.status, started_us = excluded.started_us, record = excluded.record'
)
_CHAIN = """
WITH RECURSIVE chain (node_id, parent_id, body, depth) AS (
    SELECT node_id, parent_id, body, 1 FROM message_nodes WHERE node_id = ? AND run_id = ?
    UNION ALL
    SELECT n.node_id, n.parent_id, n.body, c.depth + 1
    FROM chain AS c JOIN message_nodes AS n ON n.node_id = c.parent_id
    WHERE c.depth < ?
)
SELECT node_id, parent_id, body FROM chain
"""
_NODE_EXISTS: Final = 'SELECT 1 FROM message_nodes WHERE node_id = ? AND run_id = ?'
_SNAPSHOT_STATES: Final = 'SELECT seq, state FROM snapshots WHERE run_id = ?'
_SNAPSHOT_SUMMARY: Final = (
    "SELECT COALESCE(MAX(seq), 0), COALESCE(MAX(CASE WHEN state = 'complete' THEN seq END), 0), COUNT(*), "
    "COALESCE(SUM(state = 'complete'), 0) FROM snapshots WHERE run_id = ?"
)
_LAST_NODE = 'SELECT MAX(COALESCE((SELECT MAX(node_id) FROM message_nodes), 0), (SELECT last FROM node_ids))'
"""The highest node id ever handed out: the newest node's, or a deleted run's (see `delete_run`)."""
_RUN_TABLES = (
    'events',
    'tool_effects',
    'snapshots',
    'snapshot_idempotency_keys',
    'message_nodes',
    'runs',
    'run_leases',
)


def _run_row(row: tuple[Any, ...], run_id: str | None = None) -> ops.RunRow:
    """`run_id`: the run asked for, named in place of the row's own column (see `_snapshot_row`)."""
    return ops.RunRow(
        run_id=run_id or row[0], started_at=_started(row[1]), conversation_id=row[2], parent_run_id=row[3], body=row[4]
    )


def _lease_row(row: tuple[Any, ...]) -> ops.LeaseRow:
    return ops.LeaseRow(run_id=row[0], epoch=int(row[1]), state=row[2], host=row[3], expires=float(row[4]), body=row[5])


def _snapshot_row(row: tuple[Any, ...], run_id: str) -> ops.SnapshotRow:
    """A row of the run asked for: the index found it under `run_id`, so that is the run a damaged
    `run_id` column would otherwise misname (the record's checksum binds the run id it is read as)."""
    head, length, seq = row[2], row[3], row[5]
    if not (isinstance(length, int) and (head is None or isinstance(head, int)) and isinstance(seq, int)):
        # a damaged column type (NULL or text where the schema holds an integer): one damaged record
        reason = f'snapshot row columns are damaged (head {head!r}, length {length!r}, seq {seq!r})'
        return ops.SnapshotRow(run_id, '', None, 0, ops.Unparsable(reason), seq=seq if isinstance(seq, int) else None)
    return ops.SnapshotRow(run_id=run_id, state=row[1], head=head, length=length, body=row[4], seq=seq)


def _effect_row(row: tuple[Any, ...], run_id: str) -> ops.EffectRow:
    """A ledger row of the run asked for (see `_snapshot_row`)."""
    return ops.EffectRow(run_id=run_id, tool_call_id=row[1], status=row[2], started_at=_started(row[3]), body=row[4])


def _unpacked(stored: bytes) -> bytes:
    """A node body back from its column; a body that does not unpack is handed over as stored, so
    reading it fails as damage of that one message."""
    try:
        return unpack_body(stored)
    except Exception:  # zlib.error and friends: the engine names the damaged message
        return stored


class SqlitePort(SyncPort):
    """The engine's operations as SQL on one database (schema in `schema.py`)."""

    gapless_events = True  # seqs are taken as MAX + 1 inside the write transaction

    name = 'SQLite store'
    group_commit = True

    def __init__(self, db: Database) -> None:
        super().__init__(worker=None)
        self.__db = db
        # A commit that does not wait for the disk is short enough to run on the event loop; with a
        # connection of the caller's, its synchronous level is not known.
        self.inline_writes = db.owned and db.synchronous in ('OFF', 'NORMAL')
        self._connection: sqlite3.Connection | None = None

    def describe(self) -> str:
        return self.__db.describe

    def damage_of(self, error: Exception) -> str | None:
        """SQLite's words for a damaged file: a malformed page or header, text that does not decode
        (its schema's text included, which the driver reports as a `UnicodeDecodeError`)."""
        if isinstance(error, SchemaDamaged):
            return str(error)
        if isinstance(error, sqlite3.OperationalError) and str(error).startswith(_SCHEMA_SIGNS):
            # step-sqlite's statements name only columns and tables it made: the schema's text is damaged
            return str(SchemaDamaged(self.describe(), str(error)))
        # OverflowError: a stored time or number beyond any the store writes
        if isinstance(error, UnicodeDecodeError | OverflowError) or (
            isinstance(error, sqlite3.DatabaseError) and any(sign in str(error) for sign in _DAMAGE_SIGNS)
        ):
            return f'{type(error).__name__}: {error} (run PRAGMA integrity_check on the file; restore it from a backup)'
        return None

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the database's thread, with its connection lock held."""
        return await self.__db.run(self._bound(fn, args))

    def try_inline(self, fn: Callable[..., T], *args: Any) -> tuple[bool, T | None]:
        """`fn(*args)` now, on the calling thread, when the database's thread is idle (see `SyncPort`)."""
        return self.__db.try_inline(self._bound(fn, args))

    def _bound(self, fn: Callable[..., T], args: tuple[Any, ...]) -> Callable[[sqlite3.Connection], T]:
        def work(connection: sqlite3.Connection) -> T:
            self._connection = connection
            try:
                return fn(*args)
            finally:
                self._connection = None

        return work

    def _conn(self) -> sqlite3.Connection:
        assert self._connection is not None, 'SqlitePort operations run inside call()'
        return self._connection

    def transaction(self, runs: Sequence[str]) -> write_transaction:
        return write_transaction(self._conn(), busy_timeout=self.__db.timeout)

    @contextmanager
    def savepoint(self, tx: sqlite3.Connection) -> Iterator[None]:
        tx.execute('SAVEPOINT step_sqlite_write')
        try:
            yield
        except BaseException:
            tx.execute('ROLLBACK TO step_sqlite_write')
            tx.execute('RELEASE step_sqlite_write')
            raise
        tx.execute('RELEASE step_sqlite_write')

    @contextmanager
    def reading(self, run_id: str | None) -> Iterator[sqlite3.Connection]:
        yield self._conn()

    # -- runs ---------------------------------------------------------------------------------

    def insert_run(self, tx: sqlite3.Connection, op: ops.InsertRun) -> ops.RunRow | None:
        row = op.row
        found = tx.execute(f'SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?', (row.run_id,)).fetchone()
        if found is not None:
            return _run_row(found)
        tx.execute(
            'INSERT INTO runs (run_id, conversation_id, parent_run_id, started_us, record) VALUES (?, ?, ?, ?, ?)',
            (row.run_id, row.conversation_id, row.parent_run_id, _micros(row.started_at), _text(row.body)),
        )
        return None

    def get_run(self, tx: sqlite3.Connection, op: ops.GetRun) -> ops.RunRow | None:
        found = tx.execute(f'SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?', (op.run_id,)).fetchone()
        return _run_row(found, op.run_id) if found is not None else None

    def list_runs(self, tx: sqlite3.Connection, op: ops.ListRuns) -> list[ops.RunRow]:
        """Lineage, time bounds, the keyset and the limit in SQL, on the `started_us` indexes (ties
        are put in `run_id` order within one instant). The agent name is left to the engine."""
        clauses: list[str] = []
        params: list[str | int] = []
        if op.conversation_id is not None:
            clauses.append('conversation_id = ?')
            params.append(op.conversation_id)
        if op.parent_run_id is not None:
            clauses.append('parent_run_id = ?')
            params.append(op.parent_run_id)
        if op.started_after is not None:
            clauses.append('started_us > ?')
            params.append(_micros(op.started_after))
        if op.started_before is not None:
            clauses.append('started_us < ?')
            params.append(_micros(op.started_before))
        if op.after is not None:
            clauses.append(f'(started_us, run_id) {"<" if op.newest_first else ">"} (?, ?)')
            params.extend((_micros(op.after[0]), op.after[1]))
        where = f'WHERE {" AND ".join(clauses)} ' if clauses else ''
        order = 'started_us DESC, run_id DESC' if op.newest_first else 'started_us, run_id'
        limit = '' if op.limit is None else f' LIMIT {int(op.limit)}'
        rows = tx.execute(f'SELECT {_RUN_COLUMNS} FROM runs {where}ORDER BY {order}{limit}', params)
        return [_run_row(r) for r in rows]

    def store_identity(self, tx: sqlite3.Connection, op: ops.StoreIdentity) -> str:
        """The row the identity table was made with (`schema.IDENTITY`); written here only when it is missing."""
        tx.execute('INSERT OR IGNORE INTO store_identity (one, store_id) VALUES (1, ?)', (op.new_id,))
        return str(tx.execute('SELECT store_id FROM store_identity WHERE one = 1').fetchone()[0])

    def store_location(self, tx: sqlite3.Connection, op: ops.StoreLocation) -> str:
        """The database file the connection has open, its links resolved (a shared connection's too);
        `describe()` for a database in memory."""
        found = next((str(row[2]) for row in tx.execute('PRAGMA database_list') if row[1] == 'main'), '')
        return f'database {os.path.realpath(found)!r}' if found else self.describe()

    def check_integrity(self, tx: sqlite3.Connection, op: ops.CheckIntegrity) -> list[str]:
        found = [str(row[0]) for row in tx.execute('PRAGMA integrity_check')]
        return [] if found == ['ok'] else found

    def list_run_ids(self, tx: sqlite3.Connection, op: ops.ListRunIds) -> list[str]:
        return [r[0] for r in tx.execute('SELECT run_id FROM runs UNION SELECT run_id FROM snapshots')]

    def delete_run(self, tx: sqlite3.Connection, op: ops.DeleteRun) -> bool:
        # Remember the highest node id before the run's nodes go: it is never handed out again.
        tx.execute(f'UPDATE node_ids SET last = ({_LAST_NODE})')
        return (
            sum(tx.execute(f'DELETE FROM {table} WHERE run_id = ?', (op.run_id,)).rowcount for table in _RUN_TABLES) > 0
        )

    # -- events and ledger --------------------------------------------------------------------

    def put_events(self, tx: sqlite3.Connection, op: ops.PutEvents) -> None:
        for r in op.rows:  # a batch holds a few rows: `execute` each costs less than one `executemany`
            tx.execute(_APPEND_EVENT, (op.run_id, r.idempotency_key, _text(r.body), op.run_id))

    def list_events(self, tx: sqlite3.Connection, op: ops.ListEvents) -> list[ops.EventRow]:
        query, params = event_window(op, _EVENT_SELECT, '?')
        rows = tx.execute(query, (op.run_id, *params))
        return [ops.EventRow(op.run_id, key, record, seq=seq) for seq, key, record in rows]

    def put_effects(self, tx: sqlite3.Connection, op: ops.PutEffects) -> None:
        for r in op.rows:
            tx.execute(_UPSERT_EFFECT, (r.run_id, r.tool_call_id, r.status, _micros(r.started_at), _text(r.body)))

    def list_effects(self, tx: sqlite3.Connection, op: ops.ListEffects) -> list[ops.EffectRow] | int:
        if op.count and op.tool_call_id is None:  # one row per call (the upsert's key)
            return int(tx.execute('SELECT COUNT(*) FROM tool_effects WHERE run_id = ?', (op.run_id,)).fetchone()[0])
        sql = f'SELECT {_EFFECT_COLUMNS} FROM tool_effects WHERE run_id = ?'
        params: list[str] = [op.run_id]
        if op.tool_call_id is not None:
            sql += ' AND tool_call_id = ?'
            params.append(op.tool_call_id)
        return [_effect_row(r, op.run_id) for r in tx.execute(sql + ' ORDER BY started_us, rowid', params)]

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot_key_applied(self, tx: sqlite3.Connection, op: ops.SnapshotKeyApplied) -> bool:
        return (
            tx.execute(
                'SELECT 1 FROM snapshot_idempotency_keys WHERE run_id = ? AND idempotency_key = ?', (op.run_id, op.key)
            ).fetchone()
            is not None
        )

    def node_exists(self, tx: sqlite3.Connection, op: ops.NodeExists) -> bool:
        return tx.execute(_NODE_EXISTS, (op.node, op.run_id)).fetchone() is not None

    def snapshot_states(
        self, tx: sqlite3.Connection, op: ops.SnapshotStates
    ) -> list[tuple[int, str]] | tuple[int, int, int, int]:
        if op.summary:
            newest, complete, count, completes = tx.execute(_SNAPSHOT_SUMMARY, (op.run_id,)).fetchone()
            return int(newest), int(complete), int(count), int(completes)
        return [(int(s), str(st)) for s, st in tx.execute(_SNAPSHOT_STATES, (op.run_id,))]

    def put_snapshot(self, tx: sqlite3.Connection, op: ops.PutSnapshot) -> list[int]:
        run_id = op.run_id
        if op.key is not None:
            claimed = tx.execute(
                'INSERT OR IGNORE INTO snapshot_idempotency_keys (run_id, idempotency_key) VALUES (?, ?)',
                (run_id, op.key),
            ).rowcount
            if not claimed:
                raise KeyConflict(op.key)
        return self._put_snapshot(tx, run_id, op.parent, op.bodies, op.row)

    def _put_snapshot(
        self, tx: sqlite3.Connection, run_id: str, parent: int | None, bodies: Sequence[bytes], row: ops.SnapshotRow
    ) -> list[int]:
        """The new message nodes and the snapshot row (the key claimed already)."""
        nodes: list[int] = []
        if bodies:
            (last,) = tx.execute(_LAST_NODE).fetchone()
            nodes = list(range(last + 1, last + 1 + len(bodies)))
            parents = [parent, *nodes[:-1]]
            tx.executemany(
                'INSERT INTO message_nodes (node_id, run_id, parent_id, body) VALUES (?, ?, ?, ?)',
                [(n, run_id, p, pack_body(b)) for n, p, b in zip(nodes, parents, bodies, strict=True)],
            )
        head = nodes[-1] if nodes else parent
        tx.execute(
            'INSERT INTO snapshots (run_id, state, head, length, record) VALUES (?, ?, ?, ?, ?)',
            (run_id, row.state, head, row.length, _text(row.body)),
        )
        return nodes

    fused_steps = True

    def write_step(self, tx: sqlite3.Connection, op: ops.WriteStep) -> list[int] | None:
        """A step's whole write (`ops.WriteStep`) in the open transaction: the key is claimed by its
        insert alone, which under the write lock also says whether it was applied."""
        run_id = op.run_id
        if op.epoch is not None:
            found = tx.execute('SELECT epoch FROM run_leases WHERE run_id = ?', (run_id,)).fetchone()
            if found is None or found[0] != op.epoch:
                raise Fenced(run_id)
        nodes: list[int] | None = None
        snapshot = op.snapshot
        if snapshot is not None and (
            snapshot.key is None
            or tx.execute(
                'INSERT OR IGNORE INTO snapshot_idempotency_keys (run_id, idempotency_key) VALUES (?, ?)',
                (run_id, snapshot.key),
            ).rowcount
        ):
            parent = snapshot.parent
            if parent is not None and tx.execute(_NODE_EXISTS, (parent, run_id)).fetchone() is None:
                raise StaleHistory(run_id)
            states = None
            if op.max_snapshots is not None:
                states = [(int(q), str(st)) for q, st in tx.execute(_SNAPSHOT_STATES, (run_id,))]
            nodes = self._put_snapshot(tx, run_id, parent, snapshot.bodies, snapshot.row)
            if states is not None and op.max_snapshots is not None:
                doomed = pruned_with(states, snapshot.row.state, op.max_snapshots)
                if doomed:
                    tx.executemany('DELETE FROM snapshots WHERE seq = ? AND run_id = ?', [(q, run_id) for q in doomed])
        for r in op.effects:
            body = r.body.decode() if type(r.body) is bytes else _text(r.body)
            tx.execute(_UPSERT_EFFECT, (r.run_id, r.tool_call_id, r.status, _micros(r.started_at), body))
        for r in op.events:
            body = r.body.decode() if type(r.body) is bytes else _text(r.body)
            tx.execute(_APPEND_EVENT, (run_id, r.idempotency_key, body, run_id))
        return nodes

    def delete_snapshots(self, tx: sqlite3.Connection, op: ops.DeleteSnapshots) -> None:
        tx.executemany('DELETE FROM snapshots WHERE seq = ? AND run_id = ?', [(s, op.run_id) for s in op.seqs])

    def list_snapshots(self, tx: sqlite3.Connection, op: ops.ListSnapshots) -> list[ops.SnapshotRow]:
        sql = f'SELECT {_SNAPSHOT_COLUMNS} FROM snapshots WHERE run_id = ?'
        params: list[str] = [op.run_id]
        if op.complete_only:
            sql += ' AND state = ?'
            params.append(SnapshotState.COMPLETE.value)
        sql += ' ORDER BY seq DESC LIMIT 1' if op.newest else ' ORDER BY seq'
        return [_snapshot_row(r, op.run_id) for r in tx.execute(sql, params)]

    # -- leases: each swap is one write transaction, so it is atomic against every write ---------

    def get_lease(self, tx: sqlite3.Connection, op: ops.GetLease) -> ops.LeaseRead:
        found = tx.execute(f'SELECT {_LEASE_COLUMNS} FROM run_leases WHERE run_id = ?', (op.run_id,)).fetchone()
        return ops.LeaseRead(_lease_row(found) if found is not None else None, time.time())

    def swap_lease(self, tx: sqlite3.Connection, op: ops.SwapLease) -> ops.LeaseSwap:
        now = time.time()
        found = tx.execute(f'SELECT {_LEASE_COLUMNS} FROM run_leases WHERE run_id = ?', (op.run_id,)).fetchone()
        current = _lease_row(found) if found is not None else None
        if not op.matches(current, now):
            return ops.LeaseSwap(False, ops.LeaseRead(current, now))
        row = op.stored(now)
        values = (row.epoch, row.state, row.host, row.expires, _text(row.body))
        if current is None:
            tx.execute(
                'INSERT INTO run_leases (run_id, epoch, state, host, expires, body, start) '
                'VALUES (?, ?, ?, ?, ?, ?, ?)',
                (op.run_id, *values, op.start),
            )
        elif op.start is not None:
            tx.execute(
                'UPDATE run_leases SET epoch = ?, state = ?, host = ?, expires = ?, body = ?, start = ? '
                'WHERE run_id = ?',
                (*values, op.start, op.run_id),
            )
        else:
            tx.execute(
                'UPDATE run_leases SET epoch = ?, state = ?, host = ?, expires = ?, body = ? WHERE run_id = ?',
                (*values, op.run_id),
            )
        return ops.LeaseSwap(True, ops.LeaseRead(row, now))

    def list_leases(self, tx: sqlite3.Connection, op: ops.ListLeases) -> tuple[list[ops.LeaseRow], float]:
        marks = ', '.join('?' for _ in op.states)
        rows = tx.execute(f'SELECT {_LEASE_COLUMNS} FROM run_leases WHERE state IN ({marks})', op.states)
        return [_lease_row(r) for r in rows], time.time()

    def get_lease_start(self, tx: sqlite3.Connection, op: ops.GetLeaseStart) -> bytes | None:
        found = tx.execute('SELECT start FROM run_leases WHERE run_id = ?', (op.run_id,)).fetchone()
        return None if found is None or found[0] is None else bytes(found[0])

    def check_lease(self, tx: sqlite3.Connection, op: ops.CheckLease) -> None:
        found = tx.execute('SELECT epoch FROM run_leases WHERE run_id = ?', (op.run_id,)).fetchone()
        if found is None or found[0] != op.epoch:
            raise Fenced(op.run_id)

    def get_nodes(self, tx: sqlite3.Connection, op: ops.GetNodes) -> dict[int, ops.Node]:
        if len(op.chains) == 1:
            head, length = op.chains[0]
            rows = tx.execute(_CHAIN, (head, op.run_id, length))
        else:
            rows = tx.execute('SELECT node_id, parent_id, body FROM message_nodes WHERE run_id = ?', (op.run_id,))
        # A node whose id or parent is not an integer (a damaged column) is left out: the engine then
        # reports the broken chain as damage of the snapshot that needs it.
        return {n: (p, _unpacked(b)) for n, p, b in rows if isinstance(n, int) and (p is None or isinstance(p, int))}


class SqliteStepStore(EngineStore):
    """Every record of every run in one SQLite database file (WAL mode).

    Snapshots are stored incrementally: each message is written once as a node pointing at the
    message before it, and a snapshot row names its newest node and its length, so a save writes
    only the messages that are new since the previous one.

    Pass `database=` (a path; the file is created readable by its owner only and the store closes
    its connection in `aclose`) or `connection=` (an open `sqlite3.Connection` created with
    `check_same_thread=False`, shared with your application and never closed by the store), or
    another step-sqlite store's `Database` as `database=` (its connection shared, never closed here).
    Large payloads are externalized to `media_store` (`'auto'`, the default: a `SqliteMediaStore`
    on the same database; `None` keeps them inline; or a media store of your own).
    `max_snapshots_per_run` bounds the snapshots kept per run.
    Every write is one transaction: a batch's snapshot, ledger entries and events commit together.
    `synchronous` is SQLite's PRAGMA of that name; on macOS a connection the store opens also
    flushes with `F_FULLFSYNC` (`PRAGMA fullfsync` and `checkpoint_fullfsync`) unless
    `full_fsync=False` (see `step_sqlite.connection.fullfsync_pragmas`).
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT, ENCRYPTION, CHECKSUMS, LEASES}
    )

    def __init__(
        self,
        database: str | os.PathLike[str] | Database | None = None,
        *,
        connection: sqlite3.Connection | None = None,
        media_store: MediaStoreOption = 'auto',
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
        timeout: float = 30.0,
        synchronous: Synchronous = 'NORMAL',
        encryption: Encryption | None = None,
        full_fsync: bool | None = None,
    ) -> None:
        # a harness file's media go to this database's own when that is the store's media store
        externalize = check_media_store(media_store, owner=type(self).__name__) == AUTO
        db = Database.given(
            database,
            connection,
            owner=type(self).__name__,
            timeout=timeout,
            synchronous=synchronous,
            full_fsync=full_fsync,
        )

        def migrate(conn: sqlite3.Connection) -> None:
            def store_on(here: Database) -> SqliteStepStore:
                media = AUTO if externalize else None
                return SqliteStepStore(here, media_store=media, media_threshold_bytes=media_threshold_bytes)

            migrate_harness_database(conn, where=db.describe, store_on=store_on, timeout=db.timeout)

        db.add_setup('harness', migrate)
        db.add_setup(STEPS.name, lambda conn: ensure_schema(conn, STEPS, where=db.describe))
        db.add_setup(LEASE_TABLES.name, lambda conn: ensure_schema(conn, LEASE_TABLES, where=db.describe))
        db.add_setup(IDENTITY.name, lambda conn: ensure_schema(conn, IDENTITY, where=db.describe))
        self.__db = db
        super().__init__(
            SqlitePort(db),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            default_media_store=lambda: SqliteMediaStore(db),
            media_threshold_bytes=media_threshold_bytes,
            encryption=encryption,
        )

    @classmethod
    def on_database(cls, db: Database) -> SqliteStepStore:
        """A step store on another store's connection (sharing its lock and thread; never closes it)."""
        return cls(db)

    async def aclose(self) -> None:
        """Close the connection when the store opened it (a given `connection=` stays open)."""
        await self.__db.aclose()
