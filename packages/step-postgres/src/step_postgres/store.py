"""`PostgresStepStore`: runs, events, snapshots and the tool-effect ledger in PostgreSQL.

The store is the stepcore engine over `PostgresPort`, which answers the engine's operations with
SQL on pooled connections. A write is one transaction on one connection in pipeline mode:
statements whose answers the engine does not need are sent without waiting for them, so a write
without a snapshot costs one round trip and a snapshot save two (its checks, then the writes and
the commit). A fenced write (one made under a run's lease) costs no more: its check is one more
statement of the transaction, which fails the transaction on the server when the lease moved on.
A step's write comes whole (`write_step`), and sends those statements without the engine's
dispatch of each operation.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, ClassVar, Final, TypeAlias, TypeVar

from psycopg import AsyncConnection, AsyncCursor, Error, OperationalError, errors, pq, sql
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from stepcore.backend import (
    AUTO,
    CHECKSUMS,
    DEFAULT_MEDIA_THRESHOLD_BYTES,
    ENCRYPTION,
    LEASES,
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
    Ask,
    Encryption,
    EngineStore,
    Fenced,
    KeyConflict,
    MediaStoreOption,
    NodeIdBlocks,
    PipelinedPort,
    SetupOnce,
    SnapshotState,
    StaleHistory,
    event_window,
    ops,
    pruned_with,
)

from ._pool import CONNECT_TIMEOUT_SECONDS, PoolHandle
from .media import PostgresMediaStore
from .schema import DEFAULT_TABLE_PREFIX, IDENTITY, STEPS, Tables, ensure_schema
from .schema import LEASES as LEASE_TABLES

__all__ = ('DEFAULT_MEDIA', 'PostgresPort', 'PostgresStepStore')

T = TypeVar('T')
Rows: TypeAlias = list[tuple[Any, ...]]


LOCK_TIMEOUT_SECONDS: Final = 1.0
"""How long a transaction waits for a lock (a run's advisory lock, a lease row) before it gives up
with `LockNotAvailable`, which the engine tries again later: a write or a claim never waits on a
transaction that does not end (its process frozen, its host cut off)."""

DEFAULT_MEDIA: Final = AUTO
"""`media_store=` default, `'auto'`: a `PostgresMediaStore` on the store's pool and table prefix."""

_RUN_TABLES: Final = (
    'events',
    'event_keys',
    'counters',
    'nodes',
    'snapshots',
    'snapshot_keys',
    'tool_effects',
    'run_leases',
    'runs',
)


def _ask(query: sql.Composed, params: Sequence[Any] | Mapping[str, Any], answer: Callable[[Rows], T]) -> Ask[T]:
    """A read: one statement, its parameters, and how its rows become the operation's answer."""
    return Ask((query, params), answer)


def _text(body: ops.Body) -> str:
    """An engine-encoded body as the text of a `json` column."""
    return body.decode() if isinstance(body, bytes) else str(body)


def _run_row(row: tuple[Any, ...]) -> ops.RunRow:
    return ops.RunRow(run_id=row[0], started_at=row[1], conversation_id=row[2], parent_run_id=row[3], body=row[4])


def _effect_row(row: tuple[Any, ...]) -> ops.EffectRow:
    return ops.EffectRow(run_id=row[0], tool_call_id=row[1], status=row[2], started_at=row[3], body=row[4])


def _snapshot_row(row: tuple[Any, ...]) -> ops.SnapshotRow:
    return ops.SnapshotRow(run_id=row[0], state=row[1], head=row[2], length=row[3], body=row[4], seq=row[5])


def _first_run(rows: Rows) -> ops.RunRow | None:
    return _run_row(rows[0]) if rows else None


def _flag(rows: Rows) -> bool:
    return bool(rows[0][0])


def _lease_read(run_id: str, row: tuple[Any, ...]) -> ops.LeaseRead:
    """`(now, epoch, state, host, expires, body)`: the server's clock and the run's lease (epoch
    `NULL`: it has none)."""
    now, epoch, state, host, expires, body = row
    lease = None if epoch is None else ops.LeaseRow(run_id, int(epoch), state, host, float(expires), body)
    return ops.LeaseRead(lease, float(now))


def _lease_rows(rows: Rows) -> tuple[list[ops.LeaseRow], float]:
    """`(now, run_id, epoch, state, host, expires, body)` rows: the leases (none where `run_id` is
    `NULL`, the clock's row alone) and the server's clock."""
    leases = [
        ops.LeaseRow(run_id, int(epoch), state, host, float(expires), body)
        for _, run_id, epoch, state, host, expires, body in rows
        if run_id is not None
    ]
    return leases, float(rows[0][0])


def _start(rows: Rows) -> bytes | None:
    return bytes(rows[0][0]) if rows and rows[0][0] is not None else None


async def _send(tx: AsyncConnection[Any], requests: Sequence[Any]) -> list[AsyncCursor[tuple[Any, ...]]]:
    """Send `(statement, parameters)` requests; their cursors, to read the rows from (`_receive`).
    In a pipeline nothing waits for an answer until the first cursor is read."""
    cursors = [tx.cursor(row_factory=tuple_row) for _ in requests]
    for (query, params), cursor in zip(requests, cursors, strict=True):
        await cursor.execute(query, params)
    return cursors


async def _receive(cursors: Sequence[AsyncCursor[tuple[Any, ...]]]) -> list[Rows]:
    """The rows of each of `_send`'s cursors, in order: in a pipeline the first read waits for the
    answers of everything sent before it, and the rest are there already."""
    return [await cursor.fetchall() for cursor in cursors]


async def _roll_back(conn: AsyncConnection[Any]) -> None:
    """End a transaction that did not commit; a broken connection is left to the pool to discard."""
    if not conn.closed:
        with suppress(Error):
            await conn.rollback()


class PostgresPort(PipelinedPort):
    """The engine's operations as SQL on `<prefix>_*` tables (schema in `schema.py`).

    `transaction(runs)` is one connection in pipeline mode running `BEGIN`, a transaction-scoped
    advisory lock per run (so the engine's checks and the writes that follow them are not
    interleaved with another writer of the run, in any process), the operations, and `COMMIT`.
    Only reads and the rare node id refill wait for answers. Message node ids are taken from the
    table's sequence a block at a time and handed out from memory, so storing a snapshot needs no
    answer; a snapshot key another writer recorded meanwhile then fails the commit on the key's
    primary key, and the transaction raises `KeyConflict` for the engine to retry.

    Leases (`<prefix>_run_leases`) are read and compared on the server's clock only. A swap locks
    the lease row (`FOR UPDATE`), then compares and sets it in one statement; a fenced write's
    check (`check_lease`) locks the row `FOR SHARE` for the rest of its transaction and casts
    whether the epoch still holds to a domain that admits only true, so a write whose lease moved
    on fails on the server (and rolls back) without waiting for an answer of its own.
    """

    gapless_events = True  # the counter moves in the transaction that inserts

    name = 'PostgreSQL store'

    def __init__(self, handle: PoolHandle, tables: Tables) -> None:
        self.__handle = handle
        self._tables = tables
        self._q = _Queries(tables)
        self._ensure = SetupOnce(self._create_schema)
        self._node_ids = NodeIdBlocks()
        self._fences: dict[int, list[tuple[str, int]]] = {}
        """The `(run_id, epoch)` each open transaction checked (`check_lease`), by connection."""

    def damage_of(self, error: Exception) -> str | None:
        """PostgreSQL's words for damaged data (SQLSTATE class XX: `data_corrupted`, `index_corrupted`)
        and text that no longer decodes."""
        if isinstance(error, errors.DataCorrupted | errors.IndexCorrupted | UnicodeDecodeError):
            return f'{type(error).__name__}: {error} (check the database with amcheck; restore it from a backup)'
        return None

    def describe(self) -> str:
        return f"PostgreSQL tables '{self._tables.prefix}_*'"

    async def _create_schema(self) -> None:
        async with self.__handle.connection() as conn:
            await ensure_schema(conn, self._tables, STEPS)
            await ensure_schema(conn, self._tables, LEASE_TABLES)
            await ensure_schema(conn, self._tables, IDENTITY)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection in autocommit mode (the port opens its transactions itself)."""
        await self._ensure()
        async with self.__handle.connection() as conn:
            if conn.autocommit:
                yield conn
                return
            await conn.set_autocommit(True)  # an application's pool: restored before it goes back
            try:
                yield conn
            finally:
                if not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE:
                    await conn.set_autocommit(False)

    def _lock_key(self, run_id: str) -> int:
        digest = hashlib.blake2b(f'step_postgres:run:{self._tables.prefix}:{run_id}'.encode(), digest_size=8)
        return int.from_bytes(digest.digest(), 'big', signed=True)

    @asynccontextmanager
    async def transaction(self, runs: Sequence[str]) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._connection() as conn:
            checked = self._fences[id(conn)] = []
            try:
                async with conn.pipeline():
                    await conn.execute(b'BEGIN', prepare=False)
                    await conn.execute(self._q.lock_timeout, prepare=False)
                    for key in sorted({self._lock_key(run_id) for run_id in runs}):
                        await conn.execute(self._q.lock, (key,))
                    yield conn
                    await conn.execute(b'COMMIT', prepare=False)
            except BaseException as error:
                await _roll_back(conn)
                if isinstance(error, errors.LockNotAvailable):
                    await self._end_stale_holders(conn, runs)
                if isinstance(error, errors.UniqueViolation) and error.diag.table_name == self._tables.name(
                    'snapshot_keys'
                ):
                    raise KeyConflict(f'snapshot key recorded meanwhile in {self.describe()}') from error
                if isinstance(error, errors.CheckViolation) and checked and self._is_fence(error):
                    raise Fenced(await self._fenced_run(conn, checked)) from None
                raise
            finally:
                del self._fences[id(conn)]

    async def _end_stale_holders(self, conn: AsyncConnection[Any], runs: Sequence[str]) -> None:
        """After a lock wait timed out: end the transactions that hold a run's advisory lock and
        began while its lease was valid, the lease having expired since (an owner frozen or cut off
        in the middle of a write). Their writes are refused anyway (the lease is gone); ending them
        frees the run for whoever takes it over. Ending another session's backend needs the same
        role or `pg_signal_backend`; without it the run stays held until PostgreSQL drops the
        session, and the next attempt waits `LOCK_TIMEOUT_SECONDS` again."""
        if conn.closed:
            return
        for run_id in runs:
            key = self._lock_key(run_id) & 0xFFFF_FFFF_FFFF_FFFF
            with suppress(Error):
                await conn.execute(self._q.end_stale_holders, {'run': run_id, 'hi': key >> 32, 'lo': key & 0xFFFF_FFFF})

    def transient(self, error: Exception, *, write: bool) -> bool:
        """A conflict a transaction is rolled back for (serialization failure, deadlock, a lock not
        granted in time): safe to make again, read or write; a lost connection only for a read."""
        if isinstance(error, errors.SerializationFailure | errors.DeadlockDetected | errors.LockNotAvailable):
            return True
        if isinstance(error, PoolTimeout | errors.InvalidPassword):
            return False  # it waited for a connection for its whole timeout already; a wrong password stays wrong
        return not write and isinstance(error, OperationalError)

    def _is_fence(self, error: errors.CheckViolation) -> bool:
        """Whether `error` is a lease check's (`check_lease`) failing, which names the domain."""
        return error.diag.datatype_name == error.diag.constraint_name == self._tables.name('lease_held')

    async def _fenced_run(self, conn: AsyncConnection[Any], checked: Sequence[tuple[str, int]]) -> str:
        """Which of the runs a failed transaction checked lost its lease: the one run (the engine
        checks one per transaction), else the first whose epoch is not the one checked now."""
        if len(checked) > 1 and not conn.closed:
            with suppress(Error):
                cur = await conn.execute(self._q.lease_epochs, ([run_id for run_id, _ in checked],))
                now = dict(await cur.fetchall())
                return next((run_id for run_id, epoch in checked if now.get(run_id) != epoch), checked[0][0])
        return checked[0][0]

    @asynccontextmanager
    async def reading(self, run_id: str | None) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._connection() as conn:
            yield conn

    async def pipeline(self, tx: AsyncConnection[Any], requests: Sequence[Any]) -> list[Rows]:
        """Send the statements, then read their rows: inside a transaction's pipeline the server
        gets them together and the port waits once; outside one, each in turn."""
        return await _receive(await _send(tx, requests))

    async def close(self) -> None:
        await self.__handle.close()

    # -- runs ---------------------------------------------------------------------------------

    async def insert_run(self, tx: AsyncConnection[Any], op: ops.InsertRun) -> ops.RunRow | None:
        row = op.row
        params = (row.run_id, row.started_at, row.conversation_id, row.parent_run_id, _text(row.body))
        if await self.fetch(tx, _ask(self._q.run_insert, params, bool)):
            return None
        existing = await self.fetch(tx, self.ask_get_run(ops.GetRun(row.run_id)))
        if existing is None:  # pragma: no cover - deleted meanwhile by a writer without the run lock
            raise RuntimeError(f'run {row.run_id!r} was neither inserted nor found in {self.describe()}: retry')
        return existing

    def ask_get_run(self, op: ops.GetRun) -> Ask[ops.RunRow | None]:
        return _ask(self._q.run_get, (op.run_id,), _first_run)

    def ask_list_runs(self, op: ops.ListRuns) -> Ask[list[ops.RunRow]]:
        """Lineage, time bounds, the keyset and the limit in SQL; ties in `run_id` order by code point
        (`COLLATE "C"`, as the engine orders them). The agent name is left to the engine."""
        clauses: list[sql.Composable] = []
        params: list[Any] = []
        for column, value in (('conversation_id', op.conversation_id), ('parent_run_id', op.parent_run_id)):
            if value is not None:
                clauses.append(sql.SQL('{} = %s').format(sql.Identifier(column)))
                params.append(value)
        if op.started_after is not None:
            clauses.append(sql.SQL('started_at > %s'))
            params.append(op.started_after)
        if op.started_before is not None:
            clauses.append(sql.SQL('started_at < %s'))
            params.append(op.started_before)
        if op.after is not None:
            clauses.append(
                sql.SQL(
                    '(started_at, run_id COLLATE "C") < (%s, %s)'
                    if op.newest_first
                    else '(started_at, run_id COLLATE "C") > (%s, %s)'
                )
            )
            params.extend(op.after)
        parts: list[sql.Composable] = [self._q.runs_select]
        if clauses:
            parts.append(sql.SQL(' WHERE ') + sql.SQL(' AND ').join(clauses))
        parts.append(
            sql.SQL(
                ' ORDER BY started_at DESC, run_id COLLATE "C" DESC'
                if op.newest_first
                else ' ORDER BY started_at, run_id COLLATE "C"'
            )
        )
        if op.limit is not None:
            parts.append(sql.SQL(' LIMIT %s'))
            params.append(op.limit)
        return _ask(sql.Composed(parts), params, lambda rows: [_run_row(r) for r in rows])

    async def list_run_ids(self, tx: AsyncConnection[Any], op: ops.ListRunIds) -> list[str]:
        return await self.fetch(tx, _ask(self._q.run_ids, (), lambda rows: [str(r[0]) for r in rows]))

    async def delete_run(self, tx: AsyncConnection[Any], op: ops.DeleteRun) -> bool:
        """Every row of the run, its lease (and start point) included, in one statement."""
        return await self.fetch(tx, _ask(self._q.run_delete, {'run': op.run_id}, _flag))

    # -- the store itself ------------------------------------------------------------------------

    async def store_identity(self, tx: AsyncConnection[Any], op: ops.StoreIdentity) -> str:
        """Insert `op.new_id` unless the table has its row (of inserts at once, one stores its id and the
        others wait for it, then insert nothing), then read the row: one round trip."""
        _, rows = await self.pipeline(tx, [(self._q.identity_insert, (op.new_id,)), (self._q.identity_get, ())])
        return str(rows[0][0])

    async def store_location(self, tx: AsyncConnection[Any], op: ops.StoreLocation) -> str:
        """The table prefix, and the database and server the connection reached."""
        info = tx.info
        return f'{self.describe()} in database {info.dbname!r} at {info.host}:{info.port}'

    # -- events and ledger --------------------------------------------------------------------

    async def put_events(self, tx: AsyncConnection[Any], op: ops.PutEvents) -> None:
        await self._send_events(tx, op.run_id, op.rows)

    async def _send_events(self, tx: AsyncConnection[Any], run_id: str, rows: Sequence[ops.EventRow]) -> None:
        params = [{'run': run_id, 'key': r.idempotency_key, 'record': _text(r.body)} for r in rows]
        await tx.cursor().executemany(self._q.event_insert, params)

    def ask_list_events(self, op: ops.ListEvents) -> Ask[list[ops.EventRow]]:
        query, params = self._q.events_list, ()
        if op.after_seq is not None or op.limit is not None:
            query, params = self._q.events_window(op)
        return _ask(
            query,
            (op.run_id, *params),
            lambda rows: [ops.EventRow(op.run_id, key, record, seq=seq) for seq, key, record in rows],
        )

    async def put_effects(self, tx: AsyncConnection[Any], op: ops.PutEffects) -> None:
        await self._send_effects(tx, op.rows)

    async def _send_effects(self, tx: AsyncConnection[Any], rows: Sequence[ops.EffectRow]) -> None:
        params = [(r.run_id, r.tool_call_id, r.status, r.started_at, _text(r.body)) for r in rows]
        await tx.cursor().executemany(self._q.effect_upsert, params)

    def ask_list_effects(self, op: ops.ListEffects) -> Ask[list[ops.EffectRow]] | Ask[int]:
        if op.count and op.tool_call_id is None:  # one row per call (the upsert's key)
            return _ask(self._q.effects_count, (op.run_id,), lambda rows: int(rows[0][0]))
        if op.tool_call_id is not None:
            query, params = self._q.effect_get, (op.run_id, op.tool_call_id)
        else:
            query, params = self._q.effects_list, (op.run_id,)
        return _ask(query, params, lambda rows: [_effect_row(r) for r in rows])

    # -- snapshots ----------------------------------------------------------------------------

    def ask_snapshot_key_applied(self, op: ops.SnapshotKeyApplied) -> Ask[bool]:
        return _ask(self._q.snapshot_key_applied, (op.run_id, op.key), _flag)

    def ask_node_exists(self, op: ops.NodeExists) -> Ask[bool]:
        return _ask(self._q.node_exists, (op.node, op.run_id), _flag)

    def ask_snapshot_states(
        self, op: ops.SnapshotStates
    ) -> Ask[list[tuple[int, str]]] | Ask[tuple[int, int, int, int]]:
        if op.summary:
            return _ask(self._q.snapshot_summary, (op.run_id,), lambda rows: tuple(int(v) for v in rows[0]))
        return _ask(self._q.snapshot_states, (op.run_id,), lambda rows: [(int(s), str(st)) for s, st in rows])

    async def put_snapshot(self, tx: AsyncConnection[Any], op: ops.PutSnapshot) -> list[int]:
        nodes = await self._take_node_ids(tx, len(op.bodies))
        await self._send_snapshot(tx, op.run_id, op, nodes)
        return nodes

    async def _take_node_ids(self, tx: AsyncConnection[Any], count: int) -> list[int]:
        """`count` message node ids, from the store's block; a refill (rare) waits for its answer."""

        async def reserve(count: int) -> list[int]:
            params = (self._tables.name('node_ids'), count)
            return await self.fetch(tx, _ask(self._q.node_ids, params, lambda rows: [int(r[0]) for r in rows]))

        return await self._node_ids.take(count, reserve)

    async def _send_snapshot(
        self, tx: AsyncConnection[Any], run_id: str, snapshot: ops.PutSnapshot | ops.SnapshotWrite, nodes: list[int]
    ) -> None:
        """The snapshot's one statement (key, counter, new nodes `nodes`, row), its answer not awaited."""
        row = snapshot.row
        params = {
            'run': run_id,
            'key': snapshot.key,
            'nodes': nodes,
            'parents': [snapshot.parent, *nodes[:-1]] if nodes else [],
            'bodies': list(snapshot.bodies),
            'state': row.state,
            'step_index': ops.legacy_step_index(row.body),
            'head': nodes[-1] if nodes else snapshot.parent,
            'length': row.length,
            'record': _text(row.body),
        }
        await tx.execute(self._q.snapshot_insert, params)

    async def delete_snapshots(self, tx: AsyncConnection[Any], op: ops.DeleteSnapshots) -> None:
        await self._send_delete(tx, op.run_id, op.seqs)

    async def _send_delete(self, tx: AsyncConnection[Any], run_id: str, seqs: Sequence[int]) -> None:
        await tx.execute(self._q.snapshot_delete, (run_id, list(seqs)))

    def ask_list_snapshots(self, op: ops.ListSnapshots) -> Ask[list[ops.SnapshotRow]]:
        query = self._q.snapshots[op.newest, op.complete_only]
        return _ask(
            query,
            {'run': op.run_id, 'complete': SnapshotState.COMPLETE.value},
            lambda rows: [_snapshot_row(r) for r in rows],
        )

    def ask_get_nodes(self, op: ops.GetNodes) -> Ask[dict[int, ops.Node]]:
        return _ask(
            self._q.nodes_reach,
            {'run': op.run_id, 'heads': [head for head, _ in op.chains]},
            lambda rows: {int(n): (p, bytes(b)) for n, p, b in rows},
        )

    # -- leases: every time is the server's (`clock_timestamp()`, read once per statement) ------

    def ask_get_lease(self, op: ops.GetLease) -> Ask[ops.LeaseRead]:
        return _ask(self._q.lease_get, (op.run_id,), lambda rows: _lease_read(op.run_id, rows[0]))

    async def swap_lease(self, tx: AsyncConnection[Any], op: ops.SwapLease) -> ops.LeaseSwap:
        """Lock the lease row (`FOR UPDATE`: no other swap, and no write fenced with its epoch, can
        hold it meanwhile), then compare and set it in one statement on the server's clock, read
        after the lock was granted. Both go in one round trip.

        With `expect=None` the set is `INSERT ... ON CONFLICT DO NOTHING`: a lease inserted by a
        writer that does not take the run's advisory lock (there is none in this package) and
        committed while the insert waited for it is not in the statement's snapshot, so the answer
        is then read again.
        """
        row = op.row
        params = {
            'run': op.run_id,
            'epoch': row.epoch,
            'state': row.state,
            'host': row.host,
            'ttl': op.ttl,
            'body': _text(row.body),
            'start': op.start,
            'expect': op.expect,
            'expired': op.expired,
            'expect_expires': op.expect_expires,
        }
        swap = self._q.lease_insert if op.expect is None else self._q.lease_update
        _, rows = await self.pipeline(tx, [(self._q.lease_lock, (op.run_id,)), (swap, params)])
        now, swapped, *lease = rows[0]
        read = _lease_read(op.run_id, (now, *lease))
        if swapped is None and op.expect is None:  # pragma: no cover - see the docstring
            read = await self.fetch(tx, self.ask_get_lease(ops.GetLease(op.run_id)))
        return ops.LeaseSwap(bool(swapped), read)

    def ask_list_leases(self, op: ops.ListLeases) -> Ask[tuple[list[ops.LeaseRow], float]]:
        return _ask(self._q.leases_list, (list(op.states),), _lease_rows)

    def ask_get_lease_start(self, op: ops.GetLeaseStart) -> Ask[bytes | None]:
        return _ask(self._q.lease_start, (op.run_id,), _start)

    async def check_lease(self, tx: AsyncConnection[Any], op: ops.CheckLease) -> None:
        """One statement sent with the transaction's others, whose answer is not awaited: it locks
        the lease row `FOR SHARE` until the transaction ends, so a takeover (its `FOR UPDATE`) waits
        for the write to commit and then sees it, and fails the transaction on the server when the
        lease is not at `op.epoch` (a takeover committed first, or the run has no lease).
        `transaction()` then raises `Fenced`."""
        await self._send_fence(tx, op.run_id, op.epoch)

    async def _send_fence(self, tx: AsyncConnection[Any], run_id: str, epoch: int) -> None:
        checked = self._fences.get(id(tx))
        if checked is None:
            raise RuntimeError(f'check_lease of run {run_id!r} runs only inside a write transaction')
        checked.append((run_id, epoch))
        await tx.execute(self._q.lease_check, (run_id, epoch))

    # -- a step's whole write -------------------------------------------------------------------

    fused_steps = True

    async def write_step(self, tx: AsyncConnection[Any], op: ops.WriteStep) -> list[int] | None:
        """A step's write (`ops.WriteStep`) as `write_plan` makes it, without the engine's dispatch of
        each operation: the fence first (`check_lease`, answered with what follows it), then with a
        snapshot its checks, sent together with a refill of node ids when one is due and answered
        in one round trip; then the writes, sent without waiting and answered with the commit.

        The node ids of the new messages are taken before the checks are answered, so a snapshot
        skipped (its key applied) or refused (`StaleHistory`) leaves its ids unused, a gap like
        those every store object leaves. The write boundaries of the operations it stands for are
        marked as the engine marks them (`Port.boundary`), so a fault injected at one stops the step
        at the same point either way."""
        run_id = op.run_id
        if op.epoch is not None:
            await self._send_fence(tx, run_id, op.epoch)
        nodes = None if op.snapshot is None else await self._write_snapshot(tx, run_id, op.snapshot, op.max_snapshots)
        if op.effects:
            self.boundary('put_effects')
            await self._send_effects(tx, op.effects)
        if op.events:
            self.boundary('put_events')
            await self._send_events(tx, run_id, op.events)
        return nodes

    async def _write_snapshot(
        self, tx: AsyncConnection[Any], run_id: str, snapshot: ops.SnapshotWrite, max_snapshots: int | None
    ) -> list[int] | None:
        """`write_plan`'s snapshot part: its new node ids, or `None` when its key was applied."""
        key, parent = snapshot.key, snapshot.parent
        checks: list[Ask[Any]] = []
        if key is not None:
            checks.append(self.ask_snapshot_key_applied(ops.SnapshotKeyApplied(run_id, key)))
        if parent is not None:
            checks.append(self.ask_node_exists(ops.NodeExists(run_id, parent)))
        if max_snapshots is not None:
            checks.append(self.ask_snapshot_states(ops.SnapshotStates(run_id)))
        sent = await _send(tx, [check.request for check in checks])
        nodes = await self._take_node_ids(tx, len(snapshot.bodies))  # a refill waits with the checks
        answers = iter([check.answer(rows) for check, rows in zip(checks, await _receive(sent), strict=True)])
        applied = key is not None and next(answers)
        parent_found = parent is None or next(answers)
        states = next(answers) if max_snapshots is not None else ()
        if applied:
            return None
        if not parent_found:
            raise StaleHistory(run_id)
        self.boundary('put_snapshot')
        await self._send_snapshot(tx, run_id, snapshot, nodes)
        if max_snapshots is not None:
            doomed = pruned_with(states, snapshot.row.state, max_snapshots)
            if doomed:
                self.boundary('delete_snapshots')
                await self._send_delete(tx, run_id, doomed)
        return nodes


class _Queries:
    """Every statement the port runs, composed once with the prefix's identifiers."""

    def __init__(self, tables: Tables) -> None:
        q = tables.query
        self.lock = q('SELECT pg_advisory_xact_lock(%s)')
        self.lock_timeout = f"SET LOCAL lock_timeout = '{round(LOCK_TIMEOUT_SECONDS * 1000)}ms'".encode()
        # The sessions holding the run's advisory lock (a bigint key: its high and low 32 bits, as
        # `pg_locks` shows them) in a transaction begun before the run's lease expired.
        self.end_stale_holders = q(
            """SELECT pg_terminate_backend(a.pid)
            FROM pg_locks l
            JOIN pg_stat_activity a ON a.pid = l.pid
            JOIN {run_leases} r ON r.run_id = %(run)s
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
              AND l.classid = %(hi)s::bigint::oid AND l.objid = %(lo)s::bigint::oid
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND l.pid <> pg_backend_pid()
              AND r.state <> 'ended'
              AND r.expires < extract(epoch FROM clock_timestamp())
              AND a.xact_start < to_timestamp(r.expires)"""
        )
        run_columns = 'SELECT run_id, started_at, conversation_id, parent_run_id, record FROM {runs}'
        self.run_insert = q(
            """INSERT INTO {runs} (run_id, started_at, conversation_id, parent_run_id, record)
            VALUES (%s, %s, %s, %s, %s::json) ON CONFLICT (run_id) DO NOTHING RETURNING true"""
        )
        self.run_get = q(run_columns + ' WHERE run_id = %s')
        self.identity_insert = q(
            'INSERT INTO {store_identity} (store_id) VALUES (%s) ON CONFLICT DO NOTHING RETURNING store_id'
        )
        self.identity_get = q('SELECT store_id FROM {store_identity}')
        self.runs_select = q(run_columns)
        self.run_ids = q('SELECT run_id FROM {runs} UNION SELECT run_id FROM {snapshots}')
        ids = tables.identifiers()
        deleted = [sql.Identifier(f'd_{table}') for table in _RUN_TABLES]
        self.run_delete = sql.SQL('WITH {deletes} SELECT {counts} > 0').format(
            deletes=sql.SQL(', ').join(
                sql.SQL('{} AS (DELETE FROM {} WHERE run_id = %(run)s RETURNING 1)').format(name, ids[table])
                for name, table in zip(deleted, _RUN_TABLES, strict=True)
            ),
            counts=sql.SQL(' + ').join(sql.SQL('(SELECT count(*) FROM {})').format(name) for name in deleted),
        )
        # One statement per event: claim its idempotency key (a key applied before claims nothing
        # and the rest does nothing), then bump the run's event counter, whose row lock orders
        # writers of the run, and insert the event with the new seq.
        self.event_insert = q(
            """WITH claim AS (
                INSERT INTO {event_keys} (run_id, idempotency_key)
                SELECT %(run)s, %(key)s::text WHERE %(key)s::text IS NOT NULL
                ON CONFLICT DO NOTHING RETURNING 1
            ),
            c AS (
                INSERT INTO {counters} (run_id, kind, value)
                SELECT %(run)s, 'event', 1 WHERE %(key)s::text IS NULL OR EXISTS (SELECT 1 FROM claim)
                ON CONFLICT (run_id, kind) DO UPDATE SET value = {counters}.value + 1
                RETURNING value
            )
            INSERT INTO {events} (run_id, seq, idempotency_key, record)
            SELECT %(run)s, c.value, %(key)s::text, %(record)s::json FROM c"""
        )
        self.events_list = q('SELECT seq, idempotency_key, record FROM {events} WHERE run_id = %s ORDER BY seq')
        self._query = q
        self.effect_upsert = q(
            """INSERT INTO {tool_effects} (run_id, tool_call_id, status, started_at, record)
            VALUES (%s, %s, %s, %s, %s::json)
            ON CONFLICT (run_id, tool_call_id) DO UPDATE
            SET status = EXCLUDED.status, started_at = EXCLUDED.started_at, record = EXCLUDED.record"""
        )
        effect_columns = 'SELECT run_id, tool_call_id, status, started_at, record FROM {tool_effects}'
        self.effect_get = q(effect_columns + ' WHERE run_id = %s AND tool_call_id = %s')
        self.effects_list = q(effect_columns + ' WHERE run_id = %s ORDER BY started_at, ord')
        self.effects_count = q('SELECT count(*) FROM {tool_effects} WHERE run_id = %s')
        self.snapshot_key_applied = q(
            'SELECT EXISTS (SELECT 1 FROM {snapshot_keys} WHERE run_id = %s AND idempotency_key = %s)'
        )
        self.node_exists = q('SELECT EXISTS (SELECT 1 FROM {nodes} WHERE node_id = %s AND run_id = %s)')
        self.snapshot_states = q('SELECT seq, state FROM {snapshots} WHERE run_id = %s ORDER BY seq')
        self.snapshot_summary = q(
            "SELECT COALESCE(MAX(seq), 0), COALESCE(MAX(seq) FILTER (WHERE state = 'complete'), 0), count(*), "
            "count(*) FILTER (WHERE state = 'complete') FROM {snapshots} WHERE run_id = %s"
        )
        self.node_ids = q('SELECT nextval(%s::regclass) FROM generate_series(1, %s)')
        # The key is inserted without ON CONFLICT: a key recorded meanwhile fails the transaction.
        # The new nodes (ids given) chain off %(parent)s in order; the snapshot row takes the run's
        # next snapshot seq from its counter.
        self.snapshot_insert = q(
            """WITH claim AS (
                INSERT INTO {snapshot_keys} (run_id, idempotency_key)
                SELECT %(run)s, %(key)s::text WHERE %(key)s::text IS NOT NULL
            ),
            c AS (
                INSERT INTO {counters} (run_id, kind, value) VALUES (%(run)s, 'snapshot', 1)
                ON CONFLICT (run_id, kind) DO UPDATE SET value = {counters}.value + 1
                RETURNING value
            ),
            new_nodes AS (
                INSERT INTO {nodes} (node_id, run_id, parent, body)
                SELECT t.node_id, %(run)s, t.parent, t.body
                FROM unnest(%(nodes)s::bigint[], %(parents)s::bigint[], %(bodies)b::bytea[])
                    AS t(node_id, parent, body)
            )
            INSERT INTO {snapshots} (run_id, seq, state, step_index, head, length, record)
            SELECT %(run)s, c.value, %(state)s::text, %(step_index)s::bigint, %(head)s::bigint,
                %(length)s::integer, %(record)s::json
            FROM c"""
        )
        self.snapshot_delete = q('DELETE FROM {snapshots} WHERE run_id = %s AND seq = ANY(%s::bigint[])')
        snapshot_columns = 'SELECT run_id, state, head, length, record, seq FROM {snapshots} WHERE run_id = %(run)s'
        complete = ' AND state = %(complete)s'
        self.snapshots: dict[tuple[bool, bool], sql.Composed] = {
            (False, False): q(snapshot_columns + ' ORDER BY seq'),
            (False, True): q(snapshot_columns + complete + ' ORDER BY seq'),
            (True, False): q(snapshot_columns + ' ORDER BY seq DESC LIMIT 1'),
            (True, True): q(snapshot_columns + complete + ' ORDER BY seq DESC LIMIT 1'),
        }
        # Every node on the chains back from the heads, each once (a damaged, cyclic chain ends too).
        self.nodes_reach = q(
            """WITH RECURSIVE reach (node_id, parent) AS (
                SELECT node_id, parent FROM {nodes}
                WHERE node_id = ANY(%(heads)s::bigint[]) AND run_id = %(run)s
                UNION
                SELECT n.node_id, n.parent FROM reach r JOIN {nodes} n ON n.node_id = r.parent
                WHERE n.run_id = %(run)s
            )
            SELECT n.node_id, n.parent, n.body FROM reach JOIN {nodes} n USING (node_id)"""
        )

        # -- leases. The server's clock, read once per statement (a CTE that calls a volatile
        # function is evaluated once), in seconds since the Unix epoch like `expires`.
        clock = 'WITH clock AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now)'
        self.lease_get = q(
            clock
            + """ SELECT clock.now, l.epoch, l.state, l.host, l.expires, l.body::text
            FROM clock LEFT JOIN {run_leases} l ON l.run_id = %s"""
        )
        # `state <> 'ended'` as written in the partial index, so a generic plan can use it too.
        self.leases_list = q(
            clock
            + """ SELECT clock.now, l.run_id, l.epoch, l.state, l.host, l.expires, l.body::text
            FROM clock LEFT JOIN {run_leases} l ON l.state = ANY(%s::text[]) AND l.state <> 'ended'"""
        )
        self.lease_start = q('SELECT start FROM {run_leases} WHERE run_id = %s')
        self.lease_epochs = q('SELECT run_id, epoch FROM {run_leases} WHERE run_id = ANY(%s::text[])')
        self.lease_lock = q('SELECT FROM {run_leases} WHERE run_id = %s FOR UPDATE')
        # The lease after a swap: the row it stored, else the row as it is (the lock taken before
        # the statement keeps it from changing), else none; and the clock, always.
        swap_answer = """,
            found AS (
                SELECT true AS swapped, epoch, state, host, expires, body FROM stored
                UNION ALL
                SELECT false, epoch, state, host, expires, body FROM {run_leases}
                WHERE run_id = %(run)s AND NOT EXISTS (SELECT FROM stored)
            )
            SELECT clock.now, found.swapped, found.epoch, found.state, found.host, found.expires,
                found.body::text
            FROM clock LEFT JOIN found ON true"""
        self.lease_insert = q(
            clock
            + """, stored AS (
                INSERT INTO {run_leases} (run_id, epoch, state, host, expires, body, start)
                SELECT %(run)s, %(epoch)s::bigint, %(state)s::text, %(host)s::text,
                    clock.now + %(ttl)s::float8, %(body)s::json, %(start)s::bytea
                FROM clock
                ON CONFLICT (run_id) DO NOTHING
                RETURNING epoch, state, host, expires, body
            )"""
            + swap_answer
        )
        self.lease_update = q(
            clock
            + """, stored AS (
                UPDATE {run_leases} AS l
                SET epoch = %(epoch)s::bigint, state = %(state)s::text, host = %(host)s::text,
                    expires = clock.now + %(ttl)s::float8, body = %(body)s::json,
                    start = coalesce(%(start)s::bytea, l.start)
                FROM clock
                WHERE l.run_id = %(run)s AND l.epoch = %(expect)s::bigint
                    AND (NOT %(expired)s::boolean OR l.expires < clock.now)
                    AND (%(expect_expires)s::float8 IS NULL OR l.expires = %(expect_expires)s::float8)
                RETURNING l.epoch, l.state, l.host, l.expires, l.body
            )"""
            + swap_answer
        )
        # The fence of a write: `FOR SHARE` holds the row until the transaction ends; the cast
        # fails (a check violation naming the domain) unless the lease is at the writer's epoch.
        self.lease_check = q(
            """SELECT EXISTS (
                SELECT FROM {run_leases} WHERE run_id = %s AND epoch = %s::bigint FOR SHARE
            )::{lease_held}"""
        )

    def events_window(self, op: ops.ListEvents) -> tuple[sql.Composed, list[object]]:
        """The events of a run after `op.after_seq`, `op.limit` of them (the newest with `op.newest`)."""
        query, params = event_window(op, 'SELECT seq, idempotency_key, record FROM {events} WHERE run_id = %s', '%s')
        return self._query(query), params


class PostgresStepStore(EngineStore):
    """A step store in PostgreSQL tables named `<table_prefix>_<table>`.

    Connect with `pool=` (an `AsyncConnectionPool` you open and close; the store never closes it)
    or `dsn=` (the store opens its own pool on first use and closes it in `aclose()`). Tables are
    created, or migrated, on first use under an advisory lock, so many processes may share one
    database and prefix.

    Every write is one transaction: a batch's snapshot, ledger entries and events commit together.
    Snapshots are stored incrementally: each message is one row of a node table pointing at the
    message before it, and a snapshot row holds only its newest node and its length, so a save
    sends the server just the messages that are new since the run's previous save.
    `BinaryContent` data and strings of `media_threshold_bytes` or more go to `media_store` (with
    `'auto'`, the default, a `PostgresMediaStore` on the same pool and prefix; `None` keeps
    everything inline; or a media store of your own).
    `max_snapshots_per_run` bounds the snapshots kept per run.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT, ENCRYPTION, CHECKSUMS, LEASES}
    )

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        dsn: str | None = None,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        media_store: MediaStoreOption = 'auto',
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        encryption: Encryption | None = None,
    ) -> None:
        self.tables = Tables(table_prefix)
        self.table_prefix = table_prefix
        self.__handle = PoolHandle(pool=pool, dsn=dsn, owner='PostgresStepStore', connect_timeout=connect_timeout)
        super().__init__(
            PostgresPort(self.__handle, self.tables),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            default_media_store=lambda: PostgresMediaStore(table_prefix=table_prefix, _handle=self.__handle),
            media_threshold_bytes=media_threshold_bytes,
            encryption=encryption,
        )

    @property
    def pool(self) -> AsyncConnectionPool[Any] | None:
        """The connection pool in use (`None` until a DSN-built pool is first opened)."""
        return self.__handle.pool
