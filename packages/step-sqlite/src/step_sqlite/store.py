"""`SqliteStepStore`: runs, events, snapshots and the tool-effect ledger in one SQLite database."""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, ClassVar, Final, cast

from pydantic_ai.messages import ModelMessage

from stepcore.features import MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION
from stepcore.history import HistoryDelta, HistoryIndex, walk_chain
from stepcore.media import MediaStore
from stepcore.models import ContinuableSnapshot, RunRecord, SnapshotState, StepEvent, ToolEffectRecord
from stepcore.protocols import StepStore, StepWrite
from stepcore.registration import check_registration
from stepcore.retention import check_max_snapshots, snapshots_to_prune
from stepcore.walker import DEFAULT_MEDIA_THRESHOLD_BYTES, MediaWalker
from stepcore.writes import check_writes

from .connection import Database, Synchronous, write_transaction
from .media import SqliteMediaStore
from .records import dump_compact, load_compact, pack_body, unpack_body
from .schema import STEPS, ensure_schema

__all__ = ('DEFAULT_MEDIA_STORE', 'SqliteStepStore')

logger = logging.getLogger(__name__)

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


class _Default(Enum):
    MEDIA_STORE = 'default'


DEFAULT_MEDIA_STORE: Final = _Default.MEDIA_STORE
"""`media_store=` default: a `SqliteMediaStore` on the same database (its `media` table)."""


def _micros(moment: datetime) -> int:
    """Microseconds since the epoch, for ordering (a naive datetime is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICROSECOND


_SNAPSHOT_COLUMNS = 'seq, state, head, length, record'
_SnapshotRow = tuple[int, str, int | None, int, str]


def _chain(connection: sqlite3.Connection, head: int | None, length: int) -> list[bytes]:
    """Bodies of the `length` nodes ending at `head`, oldest first (one recursive query)."""
    if head is None or length == 0:
        return walk_chain(head, length, lambda node: (None, b''))
    rows = connection.execute(
        """
        WITH RECURSIVE chain (node_id, parent_id, body, depth) AS (
            SELECT node_id, parent_id, body, 1 FROM message_nodes WHERE node_id = ?
            UNION ALL
            SELECT n.node_id, n.parent_id, n.body, c.depth + 1
            FROM chain AS c JOIN message_nodes AS n ON n.node_id = c.parent_id
            WHERE c.depth < ?
        )
        SELECT body FROM chain
        """,
        (head, length),
    ).fetchall()
    if len(rows) != length:
        raise LookupError(f'stored history is broken: expected {length} messages, found {len(rows)}')
    return [unpack_body(r[0]) for r in reversed(rows)]


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


def _event_params(event: StepEvent) -> tuple[Any, ...]:
    """Parameters of `_APPEND_EVENT`: the next seq of the run, unless the idempotency key was applied."""
    return (event.run_id, event.idempotency_key, dump_compact(event, exclude={'run_id', 'seq'}), event.run_id)


def _effect_params(record: ToolEffectRecord) -> tuple[Any, ...]:
    """Parameters of `_UPSERT_EFFECT`."""
    return (
        record.run_id,
        record.tool_call_id,
        record.status.value,
        _micros(record.started_at),
        dump_compact(record, exclude={'run_id', 'tool_call_id', 'status'}),
    )


def _statements(writes: Sequence[StepWrite]) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements that apply `writes`, in order."""
    return [
        (_APPEND_EVENT, _event_params(w)) if isinstance(w, StepEvent) else (_UPSERT_EFFECT, _effect_params(w))
        for w in writes
    ]


def _run_all(connection: sqlite3.Connection, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
    for sql, params in statements:
        connection.execute(sql, params)


class _StaleBase(Exception):
    """The node a delta hangs off no longer exists; the save must start from scratch."""


class SqliteStepStore(StepStore):
    """Every record of every run in one SQLite database file (WAL mode).

    Snapshots are stored incrementally: each message is written once as a node pointing at the
    message before it, and a snapshot row names its newest node and its length, so a save writes
    only the messages that are new since the previous one.

    Pass `database=` (a path; the file is created readable by its owner only and the store closes
    its connection in `aclose`) or `connection=` (an open `sqlite3.Connection` created with
    `check_same_thread=False`, shared with your application and never closed by the store).
    Large payloads are externalized to `media_store` (default: a `SqliteMediaStore` on the same
    database; `None` keeps them inline). `max_snapshots_per_run` bounds the snapshots kept per run.
    """

    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT})

    def __init__(
        self,
        database: str | os.PathLike[str] | None = None,
        *,
        connection: sqlite3.Connection | None = None,
        media_store: MediaStore | None | _Default = DEFAULT_MEDIA_STORE,
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
        timeout: float = 30.0,
        synchronous: Synchronous = 'NORMAL',
    ) -> None:
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        self._db = Database(database, connection, owner=type(self).__name__, timeout=timeout, synchronous=synchronous)
        self._db.add_setup(STEPS.name, lambda conn: ensure_schema(conn, STEPS, where=self._db.describe))
        if isinstance(media_store, _Default):
            media_store = SqliteMediaStore.on_database(self._db)
        self.media_store: MediaStore | None = media_store
        self._history = HistoryIndex(MediaWalker(media_store, media_threshold_bytes))

    # -- runs ----------------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        row = (
            record.run_id,
            record.conversation_id,
            record.parent_run_id,
            _micros(record.started_at),
            dump_compact(record, exclude={'run_id'}),
        )

        def work(connection: sqlite3.Connection) -> None:
            with write_transaction(connection):
                found = connection.execute('SELECT record FROM runs WHERE run_id = ?', (record.run_id,)).fetchone()
                existing = load_compact(RunRecord, found[0], run_id=record.run_id) if found is not None else None
                if check_registration(existing, record):
                    connection.execute(
                        'INSERT INTO runs (run_id, conversation_id, parent_run_id, started_us, record) '
                        'VALUES (?, ?, ?, ?, ?)',
                        row,
                    )

        await self._db.run(work)

    async def get_run(self, run_id: str) -> RunRecord | None:
        row = await self._db.run(
            lambda conn: conn.execute('SELECT record FROM runs WHERE run_id = ?', (run_id,)).fetchone()
        )
        return load_compact(RunRecord, row[0], run_id=run_id) if row is not None else None

    async def list_runs(
        self, *, conversation_id: str | None = None, parent_run_id: str | None = None
    ) -> list[RunRecord]:
        clauses: list[str] = []
        params: list[str] = []
        if conversation_id is not None:
            clauses.append('conversation_id = ?')
            params.append(conversation_id)
        if parent_run_id is not None:
            clauses.append('parent_run_id = ?')
            params.append(parent_run_id)
        where = f'WHERE {" AND ".join(clauses)} ' if clauses else ''
        sql = f'SELECT run_id, record FROM runs {where}ORDER BY started_us, rowid'
        rows = await self._db.run(lambda conn: conn.execute(sql, params).fetchall())
        return [load_compact(RunRecord, r[1], run_id=r[0]) for r in rows]

    # -- events --------------------------------------------------------------------------------

    async def append_event(self, event: StepEvent) -> None:
        await self._execute([event])

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        """Append events, upsert ledger entries and save `snapshot`, in order, in one transaction."""
        writes = check_writes(writes)
        if snapshot is not None:
            await self._save(snapshot, writes)
        elif writes:
            await self._execute(writes)

    async def _execute(self, writes: Sequence[StepWrite]) -> None:
        """Write `writes` in order in one write transaction on the worker thread (serialized there too)."""

        def work(connection: sqlite3.Connection) -> None:
            statements = _statements(writes)
            with write_transaction(connection):
                _run_all(connection, statements)

        await self._db.run(work)

    async def list_events(self, run_id: str) -> list[StepEvent]:
        rows = await self._db.run(
            lambda conn: conn.execute(
                'SELECT seq, record FROM events WHERE run_id = ? ORDER BY seq', (run_id,)
            ).fetchall()
        )
        return [load_compact(StepEvent, r[1], run_id=run_id, seq=r[0]) for r in rows]

    # -- snapshots -----------------------------------------------------------------------------

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._save(snapshot, [])

    async def _save(self, snapshot: ContinuableSnapshot, writes: Sequence[StepWrite]) -> None:
        """Write `writes`, then the snapshot, in one transaction on the worker thread.

        The new messages are found and encoded there too (`HistoryIndex.save_through`). When the
        remembered history's nodes are gone (the run was deleted, e.g. with its conversation), the
        transaction is rolled back and the history stored from scratch.
        """

        def write(connection: sqlite3.Connection, delta: HistoryDelta) -> list[int] | None:
            statements = _statements(writes)
            record = dump_compact(snapshot, exclude={'run_id', 'messages', 'seq', 'state'})
            with write_transaction(connection):
                _run_all(connection, statements)
                return self._write_snapshot(connection, snapshot, delta, record)

        await self._history.save_through(snapshot.run_id, snapshot.messages, self._db.run, write, stale=_StaleBase)

    def _write_snapshot(
        self, connection: sqlite3.Connection, snapshot: ContinuableSnapshot, delta: HistoryDelta, record: str
    ) -> list[int] | None:
        """Inside the caller's transaction: claim the key, write the new nodes and the snapshot row, prune.

        Returns the new node ids, or `None` when the idempotency key was already applied.
        """
        run_id = snapshot.run_id
        if snapshot.idempotency_key is not None:
            claimed = connection.execute(
                'INSERT OR IGNORE INTO snapshot_idempotency_keys (run_id, idempotency_key) VALUES (?, ?)',
                (run_id, snapshot.idempotency_key),
            ).rowcount
            if not claimed:
                return None
        nodes: list[int] = []
        parent = delta.parent
        if (
            parent is not None
            and not connection.execute(
                'SELECT 1 FROM message_nodes WHERE node_id = ? AND run_id = ?', (parent, run_id)
            ).fetchone()
        ):
            raise _StaleBase(run_id)
        if delta.new_messages:
            (last,) = connection.execute('SELECT COALESCE(MAX(node_id), 0) FROM message_nodes').fetchone()
            nodes = list(range(last + 1, last + 1 + len(delta.new_messages)))
            parents = [parent, *nodes[:-1]]
            connection.executemany(
                'INSERT INTO message_nodes (node_id, run_id, parent_id, body) VALUES (?, ?, ?, ?)',
                [(n, run_id, p, pack_body(b)) for n, p, b in zip(nodes, parents, delta.new_messages, strict=True)],
            )
        head = self._history.head(delta, nodes)
        connection.execute(
            'INSERT INTO snapshots (run_id, state, head, length, record) VALUES (?, ?, ?, ?, ?)',
            (run_id, snapshot.state.value, head, delta.total, record),
        )
        if self.max_snapshots_per_run is not None:
            kept = connection.execute('SELECT seq, state FROM snapshots WHERE run_id = ?', (run_id,)).fetchall()
            prune = snapshots_to_prune(((int(s), str(st)) for s, st in kept), self.max_snapshots_per_run)
            if prune:
                connection.executemany('DELETE FROM snapshots WHERE seq = ?', [(s,) for s in prune])
        return nodes

    async def _materialize(self, run_id: str, row: _SnapshotRow, bodies: Sequence[bytes]) -> ContinuableSnapshot:
        seq, state, _, _, record = row
        header = load_compact(ContinuableSnapshot, record, run_id=run_id, seq=seq, state=state)
        messages: list[ModelMessage] = await self._history.decode(bodies)
        return header.model_copy(update={'messages': messages})

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        if include_interrupted:
            sql = f'SELECT {_SNAPSHOT_COLUMNS} FROM snapshots WHERE run_id = ? ORDER BY seq DESC LIMIT 1'
            params: tuple[Any, ...] = (run_id,)
        else:
            sql = f'SELECT {_SNAPSHOT_COLUMNS} FROM snapshots WHERE run_id = ? AND state = ? ORDER BY seq DESC LIMIT 1'
            params = (run_id, SnapshotState.COMPLETE.value)

        def work(connection: sqlite3.Connection) -> tuple[_SnapshotRow, list[bytes]] | None:
            row: _SnapshotRow | None = connection.execute(sql, params).fetchone()
            if row is None:
                return None
            return row, _chain(connection, row[2], row[3])

        found = await self._db.run(work)
        if found is None:
            return None
        return await self._materialize(run_id, *found)

    async def list_snapshots(self, run_id: str) -> list[ContinuableSnapshot]:
        def work(connection: sqlite3.Connection) -> tuple[list[_SnapshotRow], dict[int, tuple[int | None, bytes]]]:
            rows: list[_SnapshotRow] = connection.execute(
                f'SELECT {_SNAPSHOT_COLUMNS} FROM snapshots WHERE run_id = ? ORDER BY seq', (run_id,)
            ).fetchall()
            if not rows:
                return rows, {}
            nodes = {
                int(n): (p, unpack_body(b))
                for n, p, b in connection.execute(
                    'SELECT node_id, parent_id, body FROM message_nodes WHERE run_id = ?', (run_id,)
                )
            }
            return rows, nodes

        rows, nodes = await self._db.run(work)
        snapshots: list[ContinuableSnapshot] = []
        for row in rows:
            try:
                bodies = walk_chain(row[2], row[3], lambda node: nodes[cast(int, node)])
                snapshots.append(await self._materialize(run_id, row, bodies))
            except (ValueError, LookupError) as exc:
                logger.warning('skipping snapshot seq=%d of run %r that cannot be read: %s', row[0], run_id, exc)
        return snapshots

    # -- tool effects --------------------------------------------------------------------------

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._execute([record])

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        row = await self._db.run(
            lambda conn: conn.execute(
                'SELECT status, record FROM tool_effects WHERE run_id = ? AND tool_call_id = ?', (run_id, tool_call_id)
            ).fetchone()
        )
        if row is None:
            return None
        return load_compact(ToolEffectRecord, row[1], run_id=run_id, tool_call_id=tool_call_id, status=row[0])

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        rows = await self._db.run(
            lambda conn: conn.execute(
                'SELECT tool_call_id, status, record FROM tool_effects WHERE run_id = ? ORDER BY started_us, rowid',
                (run_id,),
            ).fetchall()
        )
        return self._effects(run_id, rows)

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        rows = await self._db.run(
            lambda conn: conn.execute(
                'SELECT tool_call_id, status, record FROM tool_effects '
                "WHERE run_id = ? AND status = 'started' ORDER BY started_us, rowid",
                (run_id,),
            ).fetchall()
        )
        return self._effects(run_id, rows)

    @staticmethod
    def _effects(run_id: str, rows: list[tuple[str, str, str]]) -> list[ToolEffectRecord]:
        return [load_compact(ToolEffectRecord, r[2], run_id=run_id, tool_call_id=r[0], status=r[1]) for r in rows]

    # -- lifecycle -----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connection when the store opened it (a given `connection=` stays open)."""
        await self._db.aclose()
