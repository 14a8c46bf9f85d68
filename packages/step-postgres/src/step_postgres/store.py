"""`PostgresStepStore`: runs, events, snapshots and the tool-effect ledger in PostgreSQL."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, Final, LiteralString, cast

from psycopg import AsyncConnection, sql
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from stepcore.codec import dump_record_json, load_record
from stepcore.features import MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION
from stepcore.history import HistoryIndex, walk_chain
from stepcore.media import MediaStore
from stepcore.models import ContinuableSnapshot, RunRecord, SnapshotState, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.protocols import StepStore, StepWrite
from stepcore.registration import check_registration
from stepcore.retention import check_max_snapshots, snapshots_to_prune
from stepcore.setup_once import SetupOnce
from stepcore.walker import DEFAULT_MEDIA_THRESHOLD_BYTES, MediaWalker
from stepcore.writes import check_writes

from ._pool import CONNECT_TIMEOUT_SECONDS, PoolHandle
from .media import PostgresMediaStore
from .schema import DEFAULT_TABLE_PREFIX, STEPS, Tables, ensure_schema

__all__ = ('PostgresStepStore',)

logger = logging.getLogger('step_postgres')


class _DefaultMedia:
    def __repr__(self) -> str:
        return '<PostgresMediaStore on the same pool>'


DEFAULT_MEDIA: Final = _DefaultMedia()

_SNAPSHOT_HEADER_EXCLUDE = {'messages', 'seq'}
_SEQ_EXCLUDE = {'seq'}


def _event_params(event: StepEvent) -> dict[str, Any]:
    return {
        'run': event.run_id,
        'key': event.idempotency_key,
        'record': dump_record_json(event, exclude=_SEQ_EXCLUDE),
    }


def _effect_params(record: ToolEffectRecord) -> tuple[Any, ...]:
    return (record.run_id, record.tool_call_id, record.status.value, record.started_at, dump_record_json(record))


class PostgresStepStore(StepStore):
    """A step store in PostgreSQL tables named `<table_prefix>_<table>`.

    Connect with `pool=` (an `AsyncConnectionPool` you open and close; the store never closes it)
    or `dsn=` (the store opens its own pool on first use and closes it in `aclose()`). Tables are
    created, or migrated, on first use under an advisory lock, so many processes may share one
    database and prefix.

    Snapshots are stored incrementally: each message is one row of a node table pointing at the
    message before it, and a snapshot row holds only its newest node and its length, so a save
    sends the server just the messages that are new since the run's previous save (one batched
    insert). `BinaryContent` data and strings of `media_threshold_bytes` or more go to
    `media_store` (by default a `PostgresMediaStore` on the same pool and prefix; `None` keeps
    everything inline).
    """

    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT})

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        dsn: str | None = None,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        media_store: MediaStore | None | _DefaultMedia = DEFAULT_MEDIA,
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    ) -> None:
        self.tables = Tables(table_prefix)
        self.table_prefix = table_prefix
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        self._handle = PoolHandle(pool=pool, dsn=dsn, owner='PostgresStepStore', connect_timeout=connect_timeout)
        if isinstance(media_store, _DefaultMedia):
            media_store = PostgresMediaStore(table_prefix=table_prefix, _handle=self._handle)
        self.media_store: MediaStore | None = media_store
        self._history = HistoryIndex(MediaWalker(media_store, media_threshold_bytes))
        self._ensure = SetupOnce(self._create_schema)
        self._q = _Queries(self.tables)

    @property
    def pool(self) -> AsyncConnectionPool[Any] | None:
        """The connection pool in use (`None` until a DSN-built pool is first opened)."""
        return self._handle.pool

    async def _create_schema(self) -> None:
        async with self._handle.connection() as conn:
            await ensure_schema(conn, self.tables, STEPS)

    async def _fetchall(self, query: sql.Composed, params: Sequence[Any] | dict[str, Any]) -> list[tuple[Any, ...]]:
        await self._ensure()
        async with self._handle.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(query, params)
            return await cur.fetchall()

    # -- runs ---------------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        await self._ensure()
        async with self._handle.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(
                self._q.run_insert,
                (
                    record.run_id,
                    record.started_at,
                    record.conversation_id,
                    record.parent_run_id,
                    record.registration_id,
                    dump_record_json(record),
                ),
            )
            if await cur.fetchone() is not None:
                return
            await cur.execute(self._q.run_get, (record.run_id,))
            row = await cur.fetchone()
        existing = load_record(RunRecord, row[0]) if row is not None else None
        if check_registration(existing, record):  # pragma: no cover - the row vanished meanwhile
            raise RuntimeError(f'run {record.run_id!r} was neither inserted nor found; retry the registration')

    async def get_run(self, run_id: str) -> RunRecord | None:
        rows = await self._fetchall(self._q.run_get, (run_id,))
        return load_record(RunRecord, rows[0][0]) if rows else None

    async def list_runs(
        self, *, conversation_id: str | None = None, parent_run_id: str | None = None
    ) -> list[RunRecord]:
        if conversation_id is not None and parent_run_id is not None:
            rows = await self._fetchall(self._q.runs_by_both, (conversation_id, parent_run_id))
        elif conversation_id is not None:
            rows = await self._fetchall(self._q.runs_by_conversation, (conversation_id,))
        elif parent_run_id is not None:
            rows = await self._fetchall(self._q.runs_by_parent, (parent_run_id,))
        else:
            rows = await self._fetchall(self._q.runs_all, ())
        return [load_record(RunRecord, row[0]) for row in rows]

    # -- events -------------------------------------------------------------------------------

    async def append_event(self, event: StepEvent) -> None:
        # One statement: claim the key, take the run's next seq, insert. A key applied before
        # claims nothing, so no seq is taken and nothing is written.
        await self._ensure()
        async with self._handle.connection() as conn:
            await conn.execute(self._q.event_insert, _event_params(event))

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        """Append events and upsert ledger entries in order, in one transaction sent as one pipeline;
        then save `snapshot` (if given) as `save_snapshot` does."""
        statements = [
            (self._q.event_insert, _event_params(w))
            if isinstance(w, StepEvent)
            else (self._q.effect_upsert, _effect_params(w))
            for w in check_writes(writes)
        ]
        if statements:
            await self._ensure()
            async with self._handle.connection() as conn, conn.pipeline(), conn.transaction():
                for query, params in statements:
                    await conn.execute(query, params)
        if snapshot is not None:
            await self.save_snapshot(snapshot)

    async def list_events(self, run_id: str) -> list[StepEvent]:
        rows = await self._fetchall(self._q.events_list, (run_id,))
        return [load_record(StepEvent, record, seq=seq) for seq, record in rows]

    # -- snapshots ----------------------------------------------------------------------------

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._ensure()
        delta = await self._history.delta(snapshot.run_id, snapshot.messages)
        parent = delta.parent
        params = {
            'run': snapshot.run_id,
            'key': snapshot.idempotency_key,
            'seq_name': self.tables.name('node_ids'),
            'bodies': delta.new_messages,
            'parent': parent if isinstance(parent, int) else None,
            'state': snapshot.state.value,
            'step_index': snapshot.step_index,
            'length': delta.total,
            'record': dump_record_json(snapshot, exclude=_SNAPSHOT_HEADER_EXCLUDE),
        }
        async with self._handle.connection() as conn:
            if self.max_snapshots_per_run is None:
                row = await self._insert_snapshot(conn, params)
            else:
                async with conn.transaction():
                    row = await self._insert_snapshot(conn, params)
                    if row is not None:
                        await self._prune(conn, snapshot.run_id, self.max_snapshots_per_run)
        if row is not None:
            self._history.commit(delta, [int(node) for node in cast(list[int], row[1])])

    async def _insert_snapshot(self, conn: AsyncConnection[Any], params: dict[str, Any]) -> tuple[Any, ...] | None:
        """Run the one-statement snapshot write; `None` when its idempotency key was applied before."""
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(self._q.snapshot_insert, params)
        return await cur.fetchone()

    async def _prune(self, conn: AsyncConnection[Any], run_id: str, limit: int) -> None:
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(self._q.snapshot_states, (run_id,))
        retained = [(int(seq), str(state)) for seq, state in await cur.fetchall()]
        doomed = snapshots_to_prune(retained, limit)
        if doomed:
            await cur.execute(self._q.snapshot_delete, (run_id, doomed))

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        query = self._q.latest_any if include_interrupted else self._q.latest_complete
        rows = await self._fetchall(query, {'run': run_id, 'complete': SnapshotState.COMPLETE.value})
        if not rows:
            return None
        seq, length, record, bodies = rows[0]
        stored = [bytes(b) for b in cast(list[bytes], bodies or [])]
        if len(stored) != length:
            raise LookupError(
                f'snapshot seq={seq} of run {run_id!r} is broken: expected {length} messages, found {len(stored)}'
            )
        messages = await self._history.decode(stored)
        return load_record(ContinuableSnapshot, record, seq=seq, messages=messages)

    async def list_snapshots(self, run_id: str) -> list[ContinuableSnapshot]:
        await self._ensure()
        async with self._handle.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(self._q.snapshots_list, (run_id,))
            headers = await cur.fetchall()
            if not headers:
                return []
            await cur.execute(self._q.snapshot_nodes, (run_id,))
            nodes: dict[int, tuple[int | None, bytes]] = {
                int(node_id): (parent, bytes(body)) for node_id, parent, body in await cur.fetchall()
            }
        found: list[ContinuableSnapshot] = []
        for seq, head, length, record in headers:
            try:
                bodies = walk_chain(head, length, lambda node: nodes[cast(int, node)])
                messages = await self._history.decode(bodies)
                found.append(load_record(ContinuableSnapshot, record, seq=seq, messages=messages))
            except (ValueError, LookupError) as exc:
                logger.error('skipping snapshot seq=%s of run %r that cannot be read: %s', seq, run_id, exc)
        return found

    # -- tool effects ---------------------------------------------------------------------------

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._ensure()
        async with self._handle.connection() as conn:
            await conn.execute(self._q.effect_upsert, _effect_params(record))

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        rows = await self._fetchall(self._q.effect_get, (run_id, tool_call_id))
        return load_record(ToolEffectRecord, rows[0][0]) if rows else None

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        rows = await self._fetchall(self._q.effects_list, (run_id,))
        return [load_record(ToolEffectRecord, row[0]) for row in rows]

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        rows = await self._fetchall(self._q.effects_by_status, (run_id, ToolEffectStatus.STARTED.value))
        return [load_record(ToolEffectRecord, row[0]) for row in rows]

    async def aclose(self) -> None:
        """Close the pool if this store opened it from `dsn=`; a given pool is left open."""
        await self._handle.close()


def _claim_key_and_seq(keys: LiteralString, kind: LiteralString) -> LiteralString:
    """The `WITH` clause of a write that takes a per-run seq: CTE `claim` takes the idempotency key
    in table `{keys}` (nothing when the key was applied before), CTE `c` then bumps the run's `kind`
    counter and yields the new seq (no row when the claim failed)."""
    return f"""WITH claim AS (
                INSERT INTO {{{keys}}} (run_id, idempotency_key)
                SELECT %(run)s, %(key)s::text WHERE %(key)s::text IS NOT NULL
                ON CONFLICT DO NOTHING RETURNING 1
            ),
            c AS (
                INSERT INTO {{counters}} (run_id, kind, value)
                SELECT %(run)s, '{kind}', 1 WHERE %(key)s::text IS NULL OR EXISTS (SELECT 1 FROM claim)
                ON CONFLICT (run_id, kind) DO UPDATE SET value = {{counters}}.value + 1
                RETURNING value
            )"""


class _Queries:
    """Every statement the store runs, composed once with the prefix's identifiers."""

    def __init__(self, tables: Tables) -> None:
        q = tables.query
        self.run_insert = q(
            """INSERT INTO {runs} (run_id, started_at, conversation_id, parent_run_id, registration_id, record)
            VALUES (%s, %s, %s, %s, %s, %s::json) ON CONFLICT (run_id) DO NOTHING RETURNING run_id"""
        )
        self.run_get = q('SELECT record FROM {runs} WHERE run_id = %s')
        self.runs_all = q('SELECT record FROM {runs} ORDER BY started_at, ord')
        self.runs_by_conversation = q('SELECT record FROM {runs} WHERE conversation_id = %s ORDER BY started_at, ord')
        self.runs_by_parent = q('SELECT record FROM {runs} WHERE parent_run_id = %s ORDER BY started_at, ord')
        self.runs_by_both = q(
            """SELECT record FROM {runs} WHERE conversation_id = %s AND parent_run_id = %s
            ORDER BY started_at, ord"""
        )
        # Writes that take a per-run seq are one statement each: claim the idempotency key (a key
        # applied before claims nothing and the rest of the statement does nothing), then bump the
        # run's counter row, whose row lock orders the writers of one run and nothing else.
        self.event_insert = q(
            _claim_key_and_seq('event_keys', 'event')
            + """
            INSERT INTO {events} (run_id, seq, idempotency_key, record)
            SELECT %(run)s, c.value, %(key)s::text, %(record)s::json FROM c"""
        )
        self.events_list = q('SELECT seq, record FROM {events} WHERE run_id = %s ORDER BY seq')
        # The new messages become nodes chained in order, the first hanging off %(parent)s; the
        # snapshot row names the newest node (or the parent when nothing is new) and the length.
        self.snapshot_insert = q(
            _claim_key_and_seq('snapshot_keys', 'snapshot')
            + """,
            new AS MATERIALIZED (
                SELECT t.ord, t.body, nextval(%(seq_name)s::regclass) AS node_id
                FROM unnest(%(bodies)s::bytea[]) WITH ORDINALITY AS t(body, ord)
                WHERE EXISTS (SELECT 1 FROM c)
            ),
            inserted AS (
                INSERT INTO {nodes} (node_id, run_id, parent, body)
                SELECT node_id, %(run)s, COALESCE(lag(node_id) OVER (ORDER BY ord), %(parent)s::bigint), body
                FROM new
            ),
            snap AS (
                INSERT INTO {snapshots} (run_id, seq, state, step_index, head, length, record)
                SELECT %(run)s, c.value, %(state)s, %(step_index)s,
                    COALESCE((SELECT node_id FROM new ORDER BY ord DESC LIMIT 1), %(parent)s::bigint),
                    %(length)s, %(record)s::json
                FROM c
            )
            SELECT c.value, ARRAY(SELECT node_id FROM new ORDER BY ord) FROM c"""
        )
        self.snapshot_states = q('SELECT seq, state FROM {snapshots} WHERE run_id = %s ORDER BY seq')
        self.snapshot_delete = q('DELETE FROM {snapshots} WHERE run_id = %s AND seq = ANY(%s::bigint[])')
        latest = """WITH RECURSIVE s AS (
                SELECT seq, head, length, record FROM {snapshots}
                WHERE run_id = %(run)s {filter} ORDER BY seq DESC LIMIT 1
            ),
            chain (node_id, parent, body, depth) AS (
                SELECT n.node_id, n.parent, n.body, 1 FROM {nodes} n JOIN s ON n.node_id = s.head
                UNION ALL
                SELECT n.node_id, n.parent, n.body, c.depth + 1
                FROM chain c JOIN {nodes} n ON n.node_id = c.parent CROSS JOIN s
                WHERE c.depth < s.length
            )
            SELECT s.seq, s.length, s.record, (SELECT array_agg(body ORDER BY depth DESC) FROM chain) FROM s"""
        self.latest_any = sql.SQL(latest).format(filter=sql.SQL(''), **tables.identifiers())
        self.latest_complete = sql.SQL(latest).format(
            filter=sql.SQL('AND state = %(complete)s'), **tables.identifiers()
        )
        self.snapshots_list = q('SELECT seq, head, length, record FROM {snapshots} WHERE run_id = %s ORDER BY seq')
        # Every node reachable from a retained snapshot's head, each fetched once.
        self.snapshot_nodes = q(
            """WITH RECURSIVE reach (node_id, parent) AS (
                SELECT n.node_id, n.parent FROM {nodes} n
                WHERE n.node_id IN (SELECT head FROM {snapshots} WHERE run_id = %s AND head IS NOT NULL)
                UNION
                SELECT n.node_id, n.parent FROM reach r JOIN {nodes} n ON n.node_id = r.parent
            )
            SELECT n.node_id, n.parent, n.body FROM reach JOIN {nodes} n USING (node_id)"""
        )
        self.effect_upsert = q(
            """INSERT INTO {tool_effects} (run_id, tool_call_id, status, started_at, record)
            VALUES (%s, %s, %s, %s, %s::json)
            ON CONFLICT (run_id, tool_call_id) DO UPDATE
            SET status = EXCLUDED.status, started_at = EXCLUDED.started_at, record = EXCLUDED.record"""
        )
        self.effect_get = q('SELECT record FROM {tool_effects} WHERE run_id = %s AND tool_call_id = %s')
        self.effects_list = q('SELECT record FROM {tool_effects} WHERE run_id = %s ORDER BY started_at, ord')
        self.effects_by_status = q(
            'SELECT record FROM {tool_effects} WHERE run_id = %s AND status = %s ORDER BY started_at, ord'
        )
