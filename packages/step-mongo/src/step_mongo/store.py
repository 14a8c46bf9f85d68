"""`MongoStepStore`: runs, events, snapshots and the tool-effect ledger in MongoDB.

The store is the stepcore engine over `MongoPort`, which answers the engine's operations with
document reads and writes through pymongo's async client. Collections (all in one database; the
document layout is in `documents.py`):

- `runs`: one document per run, `_id` = run id (registration is an atomic insert).
- `events`: one document per step event, with a per-run `seq`.
- `snapshots`: one small document per snapshot: its header, plus `head` and `length`, which name
  the run's message nodes the snapshot consists of.
- `message_nodes`: one document per stored message, written once (see `stepcore.engine`).
- `snapshot_idempotency_keys`: applied snapshot keys, kept when pruning deletes snapshots.
- `tool_effects`: one document per `(run_id, tool_call_id)`, replaced on each update.
- `counters`: per-run sequence counters (`events/`, `snapshots/`, `nodes/` + run id), advanced
  with an atomic `$inc`.
- `run_leases`: one document per leased run, `_id` = run id (its lease and start point).
- `store_meta`: the store's own documents: `_id` = `identity` holds the store's id (`store_id`),
  inserted by the first store that asks for it.

Indexes are created once per store, on its first write.

A write that is not fenced uses no transaction (a standalone server has none): it is a sequence of
single-document and bulk writes, made in the engine's order, and a process killed between two of
them leaves the ones before. For one save: the new message nodes, then the snapshot document, then
its key document; then the ledger entries; then the events. So a ledger entry is `completed` only
once the snapshot holding the call's result is stored, and a killed save leaves at worst
unreferenced nodes or a snapshot whose key document is missing (its key still counts as applied:
the snapshot document carries it). Unique indexes settle races between writers: of two saves
recording one snapshot key, the second fails on the index and the engine finds the key applied; of
two appends of one event key, the second is skipped.

Leases. Every time is the server's: a swap is one `findAndModify` whose filter holds the condition
(`$expr` against `$$NOW` for an expired lease) and whose update pipeline sets `expires` to `$$NOW`
plus the time to live; reads answer `$$NOW` with the lease. A fenced write (the engine's
`CheckLease` first) is one multi-document transaction where the deployment has them (a replica set
or a sharded cluster): its first statement increments `fenced_writes` of the lease document on the
condition that the epoch is the writer's, so the transaction has written the lease document and a
takeover, which writes it too, conflicts with it: either the takeover commits first and the write
is refused, or the write commits first and the takeover sees all of it. A transaction that fails on
a transient conflict is started again: the fence is taken again and the operations made so far are
made again; if one of them answers differently, the engine runs its plan again (`KeyConflict`).
Where the server refuses transactions (a standalone `mongod`), the fence is a read of the lease
just before the writes (see docs/backends/mongo.md for what that leaves open). mongomock-motor's
client has neither `$$NOW` nor sessions: there the process's clock stands in (mongomock lives in one
process), and a fenced write runs from its check to its last write without yielding to the event
loop, which makes it atomic against every other task of that process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, TypeVar, cast

from bson.binary import Binary
from bson.errors import InvalidBSON
from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import (
    BulkWriteError,
    ConfigurationError,
    ConnectionFailure,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from stepcore.backend import (
    CHECKSUMS,
    DEFAULT_MEDIA_THRESHOLD_BYTES,
    ENCRYPTION,
    LEASES,
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
    AsyncPort,
    Encryption,
    EngineStore,
    Fenced,
    KeyConflict,
    MediaStoreOption,
    SetupOnce,
    SnapshotState,
    backoff,
    ops,
)

from .client import AsyncClient, ClientUser, Document
from .compat import is_mongomock, replace_all
from .documents import (
    NODE_PIECE_BYTES,
    effect_document,
    effect_row,
    event_document,
    event_row,
    from_millis,
    lease_fields,
    lease_row,
    micros,
    millis,
    node_documents,
    nodes_from,
    run_document,
    run_row,
    snapshot_document,
    snapshot_row,
)
from .indexes import ensure_indexes
from .media import MongoMediaStore

__all__ = ('NODE_PIECE_BYTES', 'MongoPort', 'MongoStepStore')

_STRING_KEY: Final = {'idempotency_key': {'$type': 'string'}}
_DUPLICATE_KEY: Final = 11000
"""MongoDB's error code for a write that breaks a unique index."""
_BY_START: Final = [('started_at', ASCENDING), ('started_at_us', ASCENDING), ('_id', ASCENDING)]
_NO_START: Final = {'start': 0}
"""A lease document without its start point (which only `get_lease_start` reads)."""
_ILLEGAL_OPERATION: Final = 20
"""The code a standalone `mongod` refuses a transaction with ("Transaction numbers are only allowed
on a replica set member or mongos")."""
_WRITE_CONFLICT: Final = 112
_RETRY_SECONDS: Final = 30.0
"""How long a fenced write keeps starting its transaction again after transient conflicts."""
_CONTENDED_SECONDS: Final = 2.0
"""For this long after a conflict, this process makes its fenced transactions one at a time."""

T = TypeVar('T')


def _index(keys: Sequence[tuple[str, int]], name: str, **options: Any) -> IndexModel:
    return IndexModel(list(keys), name=name, **options)


def _seq_and_key_indexes() -> list[IndexModel]:
    """A run's records in `seq` order, and each idempotency key once per run (where one is set)."""
    return [
        _index([('run_id', ASCENDING), ('seq', ASCENDING)], 'run_id_seq'),
        _index(
            [('run_id', ASCENDING), ('idempotency_key', ASCENDING)],
            'run_id_idempotency_key',
            unique=True,
            partialFilterExpression=_STRING_KEY,
        ),
    ]


_INDEXES: Final[dict[str, list[IndexModel]]] = {
    'runs': [
        _index([('conversation_id', ASCENDING)], 'conversation_id', sparse=True),
        _index([('parent_run_id', ASCENDING)], 'parent_run_id', sparse=True),
        _index([('started_at', ASCENDING)], 'started_at'),
        _index([('started_at_us', ASCENDING), ('_id', ASCENDING)], 'started_at_us_id'),
    ],
    'events': _seq_and_key_indexes(),
    'snapshots': [
        *_seq_and_key_indexes(),
        _index([('run_id', ASCENDING), ('state', ASCENDING), ('seq', ASCENDING)], 'run_id_state_seq'),
    ],
    'tool_effects': [
        _index([('run_id', ASCENDING), ('tool_call_id', ASCENDING)], 'run_id_tool_call_id', unique=True),
        _index([('run_id', ASCENDING), ('status', ASCENDING)], 'run_id_status'),
    ],
    'message_nodes': [
        _index([('run_id', ASCENDING), ('n', ASCENDING), ('part', ASCENDING)], 'run_id_n_part', unique=True),
    ],
    'run_leases': [_index([('state', ASCENDING)], 'state')],
}


def _write_errors(error: BulkWriteError) -> list[dict[str, Any]]:
    """The write errors of a failed bulk write; raises it again when the server reported more than those."""
    details = cast(dict[str, Any], error.details)
    if details.get('writeConcernErrors'):
        raise error
    return cast(list[dict[str, Any]], details.get('writeErrors', []))


def _transient(error: PyMongoError) -> bool:
    """Whether a transaction failed on a conflict (or a lost connection) and stored nothing, so it
    can start again: MongoDB labels those `TransientTransactionError` (a `WriteConflict` too);
    mongoeco reports a conflict it finds at commit by its message alone. A commit whose outcome is
    unknown (`UnknownTransactionCommitResult`) is not one: it may have been stored."""
    if error.has_error_label('UnknownTransactionCommitResult'):
        return False
    if error.has_error_label('TransientTransactionError'):
        return True
    if isinstance(error, OperationFailure):
        return error.code == _WRITE_CONFLICT or (not error.code and 'write conflict' in str(error).lower())
    return False


def _refuses_transactions(error: PyMongoError) -> bool:
    """Whether the deployment has no transactions (a standalone server, or one without sessions)."""
    return isinstance(error, ConfigurationError) or (
        isinstance(error, OperationFailure) and error.code == _ILLEGAL_OPERATION
    )


def _same(op: ops.Op, first: Any, again: Any) -> bool:
    """Whether an operation made again in a new transaction answered as it did the first time."""
    if isinstance(op, ops.SnapshotStates):
        return sorted(first) == sorted(again)  # read in natural order
    return bool(first == again)


def _ttl_millis(ttl: float) -> int:
    return round(ttl * 1000)


def _local_millis() -> int:
    """This process's clock, for mongomock only (it has no `$$NOW`; it lives in this process)."""
    return time.time_ns() // 1_000_000


@dataclass(eq=False, slots=True)
class _Write:
    """What `MongoPort.transaction` yields: one write of the engine's.

    Unfenced, it stays empty and each operation stands on its own. A fenced one records its fence
    (`check_lease`) and, in a transaction, its session and the operations made in it with their
    answers, so that a transaction stopped by a transient conflict can be made again.
    """

    fence: ops.CheckLease | None = None
    session: AsyncClientSession | None = None
    done: list[tuple[ops.Op, Any]] = field(default_factory=list[tuple[ops.Op, Any]])
    stale: bool = False
    """The session's transaction failed: it must be started again before the next statement."""
    turn: asyncio.Lock | None = None
    """The process's turn for transactions, held while conflicts persist (see `MongoPort._begin`)."""

    async def close(self) -> None:
        """End the session (the server drops a transaction still open in it) and give up the turn."""
        session, self.session = self.session, None
        try:
            if session is not None:
                with contextlib.suppress(PyMongoError):  # else the server drops it when it times out
                    await session.end_session()
        finally:
            turn, self.turn = self.turn, None
            if turn is not None:
                turn.release()


def _on(tx: Any) -> dict[str, Any]:
    """The options that make a call part of the write's transaction (none outside one)."""
    if isinstance(tx, _Write) and tx.session is not None:
        return {'session': tx.session}
    return {}


class MongoPort(AsyncPort):
    """The engine's operations as document reads and writes on one database (see the module docstring)."""

    name = 'MongoDB store'

    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db
        self._runs: AsyncCollection[Document] = db['runs']
        self._events: AsyncCollection[Document] = db['events']
        self._snapshots: AsyncCollection[Document] = db['snapshots']
        self._snapshot_keys: AsyncCollection[Document] = db['snapshot_idempotency_keys']
        self._effects: AsyncCollection[Document] = db['tool_effects']
        self._counters: AsyncCollection[Document] = db['counters']
        self._nodes: AsyncCollection[Document] = db['message_nodes']
        self._leases: AsyncCollection[Document] = db['run_leases']
        self._meta: AsyncCollection[Document] = db['store_meta']
        self._ensure_indexes = SetupOnce(self._create_indexes)
        self._local_clock = is_mongomock(db)
        """mongomock-motor's client: no `$$NOW`, no sessions, and no call yields to the event loop."""
        self.transactions: bool | None = False if self._local_clock else None
        """Whether fenced writes are transactions: `None` until the first one finds out whether the
        deployment has them (a replica set or a sharded cluster does, a standalone server does not)."""
        self._turn: asyncio.Lock | None = None
        self._contended_until = 0.0
        """Until when (event loop time) this process's transactions take turns: set by a conflict."""

    def damage_of(self, error: Exception) -> str | None:
        """A stored document that no longer decodes as BSON (or holds text that does not decode)."""
        if isinstance(error, InvalidBSON | UnicodeDecodeError):
            return f'{type(error).__name__}: {error} (validate the collection; restore it from a backup)'
        return None

    def describe(self) -> str:
        return f'MongoDB database {self._db.name!r}'

    def transient(self, error: Exception, *, write: bool) -> bool:
        """A read may be made again after a lost connection or a timeout; a write after a failure
        MongoDB labels transient for its whole transaction (a conflict), which stored nothing."""
        if not isinstance(error, PyMongoError):
            return False
        if isinstance(error, ServerSelectionTimeoutError):
            return False  # it waited for a server for its whole timeout already
        return _transient(error) or (not write and isinstance(error, ConnectionFailure))

    async def _create_indexes(self) -> None:
        for name, models in _INDEXES.items():
            await ensure_indexes(self._db[name], models)

    @asynccontextmanager
    async def transaction(self, runs: Sequence[str]) -> AsyncIterator[_Write]:
        """One write of the engine's. Unfenced, each of its writes stands on its own, in the order
        the engine makes them. Fenced, `check_lease` may open a transaction in it: it commits when
        the write ends normally and is dropped otherwise."""
        await self._ensure_indexes()
        write = _Write()

        async def commit() -> None:
            session = cast(AsyncClientSession, write.session)
            try:
                await session.commit_transaction()
            except PyMongoError:
                await self._end_server_session(session)
                raise

        try:
            yield write
            if write.session is not None:
                await self._retrying(write, commit)
        finally:
            await write.close()

    async def _end_server_session(self, session: AsyncClientSession) -> None:
        """Retire a session whose commit failed: ended on the server, and never pooled again.

        MongoDB has dropped the transaction already; mongoeco (the test server) keeps it open under
        the session's id, and every later command on that id (pymongo hands pooled ids to implicit
        sessions too) would run inside it and never be seen by anyone else. `endSessions` closes it
        there; marking pymongo's server session dirty (as pymongo does after a network error) keeps
        the id out of its pool, so no command is ever sent on an ended session.
        """
        mark_dirty = getattr(getattr(session, '_server_session', None), 'mark_dirty', None)
        if callable(mark_dirty):
            mark_dirty()
        with contextlib.suppress(PyMongoError):
            await self._db.client.admin.command('endSessions', [session.session_id])

    async def run(self, tx: Any, op: ops.Op) -> Any:
        """Carry out one operation; in a transaction, recorded, and made again with the transaction."""
        if isinstance(tx, _Write) and tx.session is not None:
            write = tx

            async def step() -> Any:
                answer = await getattr(self, op.method)(write, op)
                write.done.append((op, answer))
                return answer

            return await self._retrying(write, step)
        return await getattr(self, op.method)(tx, op)

    async def run_group(self, tx: Any, ops: Sequence[ops.Op]) -> list[Any]:
        """Independent reads, sent concurrently; one after another in a fenced write (a session
        takes one statement at a time, and on mongomock nothing may yield between fence and writes)."""
        if isinstance(tx, _Write) and tx.fence is not None:
            return [await self.run(tx, op) for op in ops]
        return list(await asyncio.gather(*(self.run(tx, op) for op in ops)))

    async def _next_seq(self, tx: Any, kind: str, run_id: str, count: int = 1) -> int:
        """Advance the run's `kind` counter by `count`; returns the new (last allocated) value."""
        for attempt in range(3):
            try:
                doc = await self._counters.find_one_and_update(
                    {'_id': f'{kind}/{run_id}'},
                    {'$inc': {'value': count}},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                    **_on(tx),
                )
            except DuplicateKeyError:
                if attempt == 2:
                    raise
                continue  # two first upserts raced on the new counter document: retry as an update
            assert doc is not None
            return cast(int, doc['value'])
        raise AssertionError('unreachable')

    # -- the store itself ------------------------------------------------------------------------

    async def store_identity(self, tx: Any, op: ops.StoreIdentity) -> str:
        """One upsert that sets the id only when it inserts the document (`$setOnInsert`), answering the
        document after it: of several at once, one inserts and the others find its id."""
        for attempt in range(3):
            try:
                doc = await self._meta.find_one_and_update(
                    {'_id': 'identity'},
                    {'$setOnInsert': {'store_id': op.new_id}},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                    **_on(tx),
                )
            except DuplicateKeyError:
                if attempt == 2:
                    raise
                continue  # two first upserts raced on the new document: the second finds it now
            found = doc.get('store_id') if doc is not None else None
            if not isinstance(found, str) or not found:
                raise ValueError(
                    f"the store's id in {self.describe()} (collection 'store_meta', document 'identity') is "
                    f'damaged: it holds {found!r}; remove the document, and the store takes a new id when next asked'
                )
            return found
        raise AssertionError('unreachable')

    # -- runs ---------------------------------------------------------------------------------

    async def insert_run(self, tx: Any, op: ops.InsertRun) -> ops.RunRow | None:
        doc = run_document(op.row)
        while True:
            try:
                await self._runs.insert_one(doc, **_on(tx))
                return None
            except DuplicateKeyError:
                existing = await self._runs.find_one({'_id': op.row.run_id}, **_on(tx))
                if existing is not None:
                    return run_row(existing)
                # deleted meanwhile: insert again

    async def get_run(self, tx: Any, op: ops.GetRun) -> ops.RunRow | None:
        doc = await self._runs.find_one({'_id': op.run_id}, **_on(tx))
        return run_row(doc) if doc is not None else None

    async def list_runs(self, tx: Any, op: ops.ListRuns) -> list[ops.RunRow]:
        """Lineage, time bounds, the keyset and the limit in one `find`, on the exact start in
        microseconds (`started_at_us`) and the run id (`_id`), both compared as the engine does."""
        query: Document = {}
        if op.conversation_id is not None:
            query['conversation_id'] = op.conversation_id
        if op.parent_run_id is not None:
            query['parent_run_id'] = op.parent_run_id
        bounds: Document = {}
        if op.started_after is not None:
            bounds['$gt'] = micros(op.started_after)
        if op.started_before is not None:
            bounds['$lt'] = micros(op.started_before)
        if bounds:
            query['started_at_us'] = bounds
        if op.after is not None:
            beyond = '$lt' if op.newest_first else '$gt'
            started, run_id = micros(op.after[0]), op.after[1]
            query['$or'] = [{'started_at_us': {beyond: started}}, {'started_at_us': started, '_id': {beyond: run_id}}]
        direction = DESCENDING if op.newest_first else ASCENDING
        cursor = self._runs.find(query, sort=[('started_at_us', direction), ('_id', direction)], **_on(tx))
        if op.limit is not None:
            cursor = cursor.limit(op.limit)
        return [run_row(doc) async for doc in cursor]

    async def list_run_ids(self, tx: Any, op: ops.ListRunIds) -> list[str]:
        found = {str(i) for i in await self._runs.distinct('_id', **_on(tx))}
        return list(found | {str(i) for i in await self._snapshots.distinct('run_id', **_on(tx))})

    async def delete_run(self, tx: Any, op: ops.DeleteRun) -> bool:
        """Every collection's documents of the run: snapshots before the message nodes they name, so
        a reader never finds a snapshot whose nodes are gone, and the run document last, so a delete
        stopped half way leaves the run listed and deleting it again finishes the job. The lease
        (with its start point) goes just before the run document."""
        run_id = op.run_id
        on = _on(tx)
        deleted = (await self._snapshots.delete_many({'run_id': run_id}, **on)).deleted_count
        deleted += (await self._snapshot_keys.delete_many({'_id.run_id': run_id}, **on)).deleted_count
        for collection in (self._nodes, self._events, self._effects):
            deleted += (await collection.delete_many({'run_id': run_id}, **on)).deleted_count
        # The node counter stays: a node id is never handed out twice for a run id, so a store that
        # still remembers the deleted run's messages cannot mistake a new run's node for its own.
        counters = [f'{kind}/{run_id}' for kind in ('events', 'snapshots')]
        deleted += (await self._counters.delete_many({'_id': {'$in': counters}}, **on)).deleted_count
        deleted += (await self._leases.delete_one({'_id': run_id}, **on)).deleted_count
        deleted += (await self._runs.delete_one({'_id': run_id}, **on)).deleted_count
        return deleted > 0

    # -- events and ledger --------------------------------------------------------------------

    async def put_events(self, tx: Any, op: ops.PutEvents) -> None:
        run_id = op.run_id
        on = _on(tx)
        keys = list({r.idempotency_key for r in op.rows if r.idempotency_key is not None})
        seen: set[str] = set()
        if keys:
            found = self._events.find({'run_id': run_id, 'idempotency_key': {'$in': keys}}, projection={'_id': 0}, **on)
            seen = {cast(str, doc['idempotency_key']) async for doc in found}
        fresh: list[ops.EventRow] = []
        for row in op.rows:
            key = row.idempotency_key
            if key is not None:
                if key in seen:
                    continue
                seen.add(key)
            fresh.append(row)
        if not fresh:
            return
        first = await self._next_seq(tx, 'events', run_id, len(fresh)) - len(fresh) + 1
        docs = [event_document(run_id, row, first + offset) for offset, row in enumerate(fresh)]
        while docs:
            try:
                await self._events.insert_many(docs, ordered=True, **on)
                return
            except BulkWriteError as error:
                # The insert stopped at its first error. A keyed event that breaks the unique index
                # was appended meanwhile by a concurrent writer: already applied, go on after it.
                # (In a transaction the server has dropped the transaction by now: the next insert
                # fails as transient, and the transaction is made again from the start.)
                errors = _write_errors(error)
                index = int(errors[0]['index']) if errors else -1
                if index < 0 or errors[0].get('code') != _DUPLICATE_KEY or 'idempotency_key' not in docs[index]:
                    raise
                docs = docs[index + 1 :]

    async def list_events(self, tx: Any, op: ops.ListEvents) -> list[ops.EventRow]:
        query: dict[str, Any] = {'run_id': op.run_id}
        if op.after_seq is not None:
            query['seq'] = {'$gt': op.after_seq}
        order = DESCENDING if op.newest and op.limit is not None else ASCENDING
        found = self._events.find(query, sort=[('seq', order)], limit=op.limit or 0, **_on(tx))
        rows = [event_row(doc) async for doc in found]
        return rows[::-1] if order == DESCENDING else rows

    async def put_effects(self, tx: Any, op: ops.PutEffects) -> None:
        """Replace-or-insert each ledger entry, in order, in one bulk write."""
        replacements = [({'run_id': r.run_id, 'tool_call_id': r.tool_call_id}, effect_document(r)) for r in op.rows]
        for attempt in range(3):
            try:
                await replace_all(self._effects, replacements, ordered=True, **_on(tx))
                return
            except BulkWriteError as error:
                errors = _write_errors(error)
                racing = errors and all(e.get('code') == _DUPLICATE_KEY for e in errors)
                if attempt == 2 or not racing:
                    raise
                # concurrent first writes raced on the unique index: replay the batch as replaces
                # (replaying the entries before the failed one rewrites the same documents)

    async def list_effects(self, tx: Any, op: ops.ListEffects) -> list[ops.EffectRow] | int:
        query: Document = {'run_id': op.run_id}
        if op.count and op.tool_call_id is None:  # one document per call (its unique index)
            return int(await self._effects.count_documents(query, **_on(tx)))
        if op.tool_call_id is not None:
            query['tool_call_id'] = op.tool_call_id
        return [effect_row(doc) async for doc in self._effects.find(query, sort=_BY_START, **_on(tx))]

    # -- snapshots ----------------------------------------------------------------------------

    async def snapshot_key_applied(self, tx: Any, op: ops.SnapshotKeyApplied) -> bool:
        """A key document, or a snapshot carrying the key (a save stopped before its key document)."""
        on = _on(tx)
        key_id = {'run_id': op.run_id, 'key': op.key}
        if await self._snapshot_keys.find_one({'_id': key_id}, projection={'_id': 1}, **on) is not None:
            return True
        found = await self._snapshots.find_one(
            {'run_id': op.run_id, 'idempotency_key': op.key}, projection={'_id': 1}, **on
        )
        return found is not None

    async def node_exists(self, tx: Any, op: ops.NodeExists) -> bool:
        found = await self._nodes.find_one(
            {'run_id': op.run_id, 'n': op.node, 'part': 0}, projection={'_id': 1}, **_on(tx)
        )
        return found is not None

    async def snapshot_states(self, tx: Any, op: ops.SnapshotStates) -> list[tuple[int, str]]:
        found = self._snapshots.find({'run_id': op.run_id}, projection={'_id': 0, 'seq': 1, 'state': 1}, **_on(tx))
        return [(cast(int, d['seq']), cast(str, d['state'])) async for d in found]

    async def put_snapshot(self, tx: Any, op: ops.PutSnapshot) -> list[int]:
        """Nodes, then the snapshot document, then the key document; `KeyConflict` when the snapshot
        or key document breaks its unique index (the key was recorded meanwhile)."""
        run_id = op.run_id
        on = _on(tx)
        nodes: list[int] = []
        if op.bodies:
            last = await self._next_seq(tx, 'nodes', run_id, len(op.bodies))
            nodes = list(range(last - len(op.bodies) + 1, last + 1))
            await self._nodes.insert_many(node_documents(run_id, nodes, op.parent, op.bodies), ordered=True, **on)
        self.boundary('put_snapshot:nodes')
        seq = await self._next_seq(tx, 'snapshots', run_id)
        head = nodes[-1] if nodes else op.parent
        doc = snapshot_document(run_id, op.row, key=op.key, seq=seq, head=head)
        try:
            inserted = await self._snapshots.insert_one(doc, **on)
        except DuplicateKeyError:
            if op.key is None:
                raise
            raise KeyConflict(op.key) from None
        self.boundary('put_snapshot:row')
        if op.key is not None:
            try:
                await self._snapshot_keys.insert_one({'_id': {'run_id': run_id, 'key': op.key}, 'seq': seq}, **on)
            except DuplicateKeyError:
                # recorded by a writer whose snapshot is pruned already: this one must not stay
                # (in a transaction, dropping the transaction takes it away)
                if not on:
                    await self._snapshots.delete_one({'_id': inserted.inserted_id})
                raise KeyConflict(op.key) from None
        return nodes

    async def delete_snapshots(self, tx: Any, op: ops.DeleteSnapshots) -> None:
        await self._snapshots.delete_many({'run_id': op.run_id, 'seq': {'$in': list(op.seqs)}}, **_on(tx))

    async def list_snapshots(self, tx: Any, op: ops.ListSnapshots) -> list[ops.SnapshotRow]:
        query: Document = {'run_id': op.run_id}
        if op.complete_only:
            query['state'] = SnapshotState.COMPLETE.value
        on = _on(tx)
        if op.newest:
            doc = await self._snapshots.find_one(query, sort=[('seq', DESCENDING)], **on)
            return [snapshot_row(doc)] if doc is not None else []
        return [snapshot_row(doc) async for doc in self._snapshots.find(query, sort=[('seq', ASCENDING)], **on)]

    async def get_nodes(self, tx: Any, op: ops.GetNodes) -> Mapping[int, ops.Node]:
        """The run's nodes up to the highest head: a chain only reaches back to older (lower) nodes."""
        heads = [head for head, _ in op.chains]
        if not heads:
            return {}
        found = self._nodes.find({'run_id': op.run_id, 'n': {'$lte': max(heads)}}, **_on(tx))
        return nodes_from([doc async for doc in found])

    # -- leases -------------------------------------------------------------------------------

    async def _lease_and_now(self, run_id: str) -> tuple[ops.LeaseRow | None, float]:
        """The run's lease (`None`: none) and the clock, read together: on a server one aggregation
        whose `$facet` answers a document even when the lease is missing, with `$$NOW`."""
        if self._local_clock:
            doc = await self._leases.find_one({'_id': run_id}, projection=_NO_START)
            return (lease_row(doc) if doc is not None else None), _local_millis() / 1000
        pipeline: list[Document] = [
            {'$match': {'_id': run_id}},
            {'$project': _NO_START},
            {'$facet': {'found': [{'$limit': 1}]}},
            {'$project': {'found': 1, 'now': '$$NOW'}},
        ]
        cursor = await self._leases.aggregate(pipeline)
        (answer,) = [doc async for doc in cursor]
        found = cast(list[Document], answer['found'])
        return (lease_row(found[0]) if found else None), millis(answer['now']) / 1000

    async def get_lease(self, tx: Any, op: ops.GetLease) -> ops.LeaseRead:
        row, now = await self._lease_and_now(op.run_id)
        return ops.LeaseRead(row, now)

    async def swap_lease(self, tx: Any, op: ops.SwapLease) -> ops.LeaseSwap:
        """One `findAndModify`: the condition in its filter, `expires` set from `$$NOW` by its update
        pipeline. Expecting no lease, it is an upsert whose filter no stored lease matches, so a
        lease that exists meanwhile fails it on the duplicate `_id`. A swap that does not match
        answers the lease as read right after it."""
        if self._local_clock:
            return await self._swap_here(op)
        ttl = _ttl_millis(op.ttl)
        fields: Document = {name: {'$literal': value} for name, value in lease_fields(op.row).items()}
        fields['expires'] = {'$add': ['$$NOW', ttl]}
        if op.start is not None:
            fields['start'] = {'$literal': Binary(op.start)}
        query: Document = {'_id': op.run_id}
        if op.expect is None:
            query['epoch'] = {'$exists': False}
        else:
            query['epoch'] = op.expect
            if op.expired:
                query['$expr'] = {'$lt': ['$expires', '$$NOW']}
            if op.expect_expires is not None:
                query['expires'] = from_millis(round(op.expect_expires * 1000))
        while True:
            try:
                doc = await self._leases.find_one_and_update(
                    query,
                    [{'$set': fields}],
                    projection=_NO_START,
                    upsert=op.expect is None,
                    return_document=ReturnDocument.AFTER,
                )
            except DuplicateKeyError:
                doc = None  # a lease exists: the swap expected none
            if doc is not None:
                # `expires` is `$$NOW + ttl` of this very operation, so now is `expires - ttl`
                now = (millis(cast(Any, doc['expires'])) - ttl) / 1000
                return ops.LeaseSwap(True, ops.LeaseRead(lease_row(doc), now))
            current, now = await self._lease_and_now(op.run_id)
            if current is None and op.expect is None:
                continue  # deleted meanwhile: try again
            return ops.LeaseSwap(False, ops.LeaseRead(current, now))

    async def _swap_here(self, op: ops.SwapLease) -> ops.LeaseSwap:
        """`swap_lease` on mongomock, on this process's clock: a read, the comparison here, a write.
        Atomic there: mongomock's calls never yield to the event loop."""
        now_ms = _local_millis()
        now = now_ms / 1000
        doc = await self._leases.find_one({'_id': op.run_id}, projection=_NO_START)
        current = lease_row(doc) if doc is not None else None
        if not op.matches(current, now):
            return ops.LeaseSwap(False, ops.LeaseRead(current, now))
        expires = now_ms + _ttl_millis(op.ttl)
        fields: Document = {**lease_fields(op.row), 'expires': from_millis(expires)}
        if op.start is not None:
            fields['start'] = Binary(op.start)
        await self._leases.update_one({'_id': op.run_id}, {'$set': fields}, upsert=True)
        stored = op.row
        row = ops.LeaseRow(op.run_id, stored.epoch, stored.state, stored.host, expires / 1000, stored.body)
        return ops.LeaseSwap(True, ops.LeaseRead(row, now))

    async def list_leases(self, tx: Any, op: ops.ListLeases) -> tuple[list[ops.LeaseRow], float]:
        """Through the index on `state`, each lease with `$$NOW` (one more read for the clock when
        there are none)."""
        query: Document = {'state': {'$in': list(op.states)}}
        if self._local_clock:
            found = self._leases.find(query, projection=_NO_START)
            return [lease_row(doc) async for doc in found], _local_millis() / 1000
        cursor = await self._leases.aggregate(
            [{'$match': query}, {'$project': _NO_START}, {'$addFields': {'now': '$$NOW'}}]
        )
        docs = [doc async for doc in cursor]
        if not docs:
            return [], (await self._lease_and_now(''))[1]  # no lease has the empty id: the clock alone
        return [lease_row(doc) for doc in docs], millis(docs[0]['now']) / 1000

    async def get_lease_start(self, tx: Any, op: ops.GetLeaseStart) -> bytes | None:
        doc = await self._leases.find_one({'_id': op.run_id}, projection={'_id': 0, 'start': 1})
        start = doc.get('start') if doc is not None else None
        return bytes(start) if isinstance(start, bytes) else None

    async def check_lease(self, tx: Any, op: ops.CheckLease) -> None:
        """The fence of a write. With transactions, it opens the write's transaction, whose first
        statement writes the lease document on the condition that its epoch is `op.epoch` (see
        `_begin`). Without (a standalone server, mongomock), it reads the lease: the writes follow
        at once, but not atomically with the read on a server (docs/backends/mongo.md)."""
        if isinstance(tx, _Write):
            tx.fence = op
            if self.transactions is not False:
                try:
                    await self._retrying(tx, _nothing)
                    return
                except PyMongoError as error:
                    if self.transactions is not None or not _refuses_transactions(error):
                        raise
                    self.transactions = False
                    await tx.close()
        found = await self._leases.find_one({'_id': op.run_id, 'epoch': op.epoch}, projection={'_id': 1})
        if found is None:
            raise Fenced(op.run_id)

    # -- fenced transactions ------------------------------------------------------------------

    async def _retrying(self, tx: _Write, step: Callable[[], Awaitable[T]]) -> T:
        """`step()` in the write's transaction, which is (re)started first when it has none or it
        failed; after a transient failure, again with a fresh transaction, for up to `_RETRY_SECONDS`.

        Under contention the store must still move forward, on a server that reports a conflict for
        any two overlapping transactions (the test server) as on one that reports them per document:
        the wait before each new start grows with the write's conflicts (random, so that writers
        that conflicted together start apart), and while conflicts persist this process makes its
        transactions one at a time (`_begin`), which leaves the others in the fleet one rival each.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _RETRY_SECONDS
        attempt = 0
        while True:
            try:
                if tx.session is None or tx.stale:
                    await self._begin(tx)
                return await step()
            except PyMongoError as error:
                if not _transient(error) or loop.time() >= deadline:
                    raise
                tx.stale = True
                attempt += 1
                self._contended_until = loop.time() + _CONTENDED_SECONDS
                await asyncio.sleep(backoff(attempt))

    async def _take_turn(self, tx: _Write) -> None:
        """While conflicts persist, wait for this process's turn to make a transaction (kept until
        the write ends); otherwise go at once."""
        if tx.turn is not None or asyncio.get_running_loop().time() >= self._contended_until:
            return
        if self._turn is None:
            self._turn = asyncio.Lock()
        await self._turn.acquire()
        tx.turn = self._turn

    async def _begin(self, tx: _Write) -> None:
        """Start the write's transaction: the fence, then every operation made so far, made again.

        The fence increments the lease document's `fenced_writes` where its epoch is the writer's:
        a write, so a takeover (which writes the document too) conflicts with the transaction, and
        one that commits first leaves the epoch changed, which refuses the write (`Fenced`). An
        operation that answers differently than the first time means the run changed meanwhile:
        `KeyConflict`, and the engine runs its plan again.
        """
        fence = tx.fence
        assert fence is not None
        session = tx.session
        tx.session = None
        if session is not None:
            with contextlib.suppress(PyMongoError):
                await session.end_session()
        await self._take_turn(tx)
        start_session = getattr(getattr(self._db, 'client', None), 'start_session', None)
        if not callable(start_session):
            raise ConfigurationError('the database object given hands out no client with sessions')
        session = tx.session = cast(AsyncClientSession, start_session())
        await session.start_transaction()
        fenced = await self._leases.update_one(
            {'_id': fence.run_id, 'epoch': fence.epoch}, {'$inc': {'fenced_writes': 1}}, session=session
        )
        self.transactions = True
        if not fenced.matched_count:
            raise Fenced(fence.run_id)
        for op, answer in tx.done:
            if not _same(op, answer, await getattr(self, op.method)(tx, op)):
                raise KeyConflict(f'run {fence.run_id!r} changed while its write was made again ({op.method})')
        tx.stale = False


async def _nothing() -> None:
    return None


class MongoStepStore(ClientUser, EngineStore):
    """Step persistence in MongoDB through pymongo's native async client.

    Pass a shared client as `client=` (never closed by this store) or a connection string as
    `db_url=` (the store owns that client: `await store.aclose()`). The shared client is a
    `pymongo.AsyncMongoClient` or any object with its API (`get_database(name)` or `client[name]`
    giving databases whose collections are async), such as a wrapper that delegates to one.
    `database` defaults to the one named in the connection string, else `stepcore`.

    Binary content and strings of `media_threshold_bytes` or more are externalized to `media_store`:
    with `'auto'` (the default) a `MongoMediaStore` on the same client and database; pass
    `media_store=None` to keep them inline, or any other `MediaStore`. `max_snapshots_per_run`
    bounds the snapshots kept per run.
    Unfenced writes are not transactions: see the module docstring for their order, and for leases.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT, ENCRYPTION, CHECKSUMS, LEASES}
    )

    def __init__(
        self,
        *,
        client: AsyncClient | None = None,
        db_url: str | None = None,
        database: str | None = None,
        media_store: MediaStoreOption = 'auto',
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
        encryption: Encryption | None = None,
    ) -> None:
        # options are checked before a client is created, so a bad one leaves nothing to close
        self.check_options(
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
        )
        ClientUser.__init__(self, 'MongoStepStore', client, db_url, database)
        EngineStore.__init__(
            self,
            MongoPort(self.database),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            default_media_store=lambda: MongoMediaStore(client=self.client, database=self.database_name),
            media_threshold_bytes=media_threshold_bytes,
            encryption=encryption,
        )

    async def aclose(self) -> None:
        """Close the client if this store created it from `db_url`; a given client stays open."""
        await ClientUser.aclose(self)
