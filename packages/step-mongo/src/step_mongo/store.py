"""`MongoStepStore`: runs, events, snapshots and the tool-effect ledger in MongoDB.

The store is the stepcore engine over `MongoPort`, which answers the engine's operations with
document reads and writes through pymongo's async client. Collections (all in one database; the
document layout is in `documents.py`):

- `runs`: one document per run, `_id` = run id (registration is an atomic insert).
- `events`: one document per step event, with a per-run `seq`.
- `snapshots`: one small document per snapshot: its header, plus `head` and `length`, which name
  the run's message nodes the snapshot consists of.
- `message_nodes`: one document per stored message, written once (see `stepcore.engine.history`).
- `snapshot_idempotency_keys`: applied snapshot keys, kept when pruning deletes snapshots.
- `tool_effects`: one document per `(run_id, tool_call_id)`, replaced on each update.
- `counters`: per-run sequence counters (`events/`, `snapshots/`, `nodes/` + run id), advanced
  with an atomic `$inc`.

Indexes are created once per store, on its first write.

There are no transactions (a standalone server has none): a write is a sequence of single-document
and bulk writes, made in the engine's order, and a process killed between two of them leaves the
ones before. For one save: the new message nodes, then the snapshot document, then its key
document; then the ledger entries; then the events. So a ledger entry is `completed` only once the
snapshot holding the call's result is stored, and a killed save leaves at worst unreferenced
nodes or a snapshot whose key document is missing (its key still counts as applied: the snapshot
document carries it). Unique indexes settle races between writers: of two saves recording one
snapshot key, the second fails on the index and the engine finds the key applied; of two appends
of one event key, the second is skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Final, cast

from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError

from stepcore.engine import AsyncPort, EngineStore, KeyConflict, ops
from stepcore.engine.encryption import Encryption
from stepcore.engine.setup_once import SetupOnce
from stepcore.media import MediaStoreOption, check_media_store, resolve_media_store
from stepcore.media.walker import DEFAULT_MEDIA_THRESHOLD_BYTES, MediaWalker
from stepcore.store.features import CHECKSUMS, ENCRYPTION, MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION
from stepcore.store.models import SnapshotState
from stepcore.store.retention import check_max_snapshots

from .client import AsyncClient, ClientUser, Document
from .compat import replace_all
from .documents import (
    NODE_PIECE_BYTES,
    effect_document,
    effect_row,
    event_document,
    event_row,
    micros,
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
}


def _write_errors(error: BulkWriteError) -> list[dict[str, Any]]:
    """The write errors of a failed bulk write; raises it again when the server reported more than those."""
    details = cast(dict[str, Any], error.details)
    if details.get('writeConcernErrors'):
        raise error
    return cast(list[dict[str, Any]], details.get('writeErrors', []))


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
        self._ensure_indexes = SetupOnce(self._create_indexes)

    def describe(self) -> str:
        return f'MongoDB database {self._db.name!r}'

    async def _create_indexes(self) -> None:
        for name, models in _INDEXES.items():
            await ensure_indexes(self._db[name], models)

    @asynccontextmanager
    async def transaction(self, runs: Sequence[str]) -> AsyncIterator[None]:
        """No session: each write stands on its own, in the order the engine makes them."""
        await self._ensure_indexes()
        yield None

    async def run_group(self, tx: Any, ops: Sequence[ops.Op]) -> list[Any]:
        """Independent reads, sent concurrently."""
        return list(await asyncio.gather(*(self.run(tx, op) for op in ops)))

    async def _next_seq(self, kind: str, run_id: str, count: int = 1) -> int:
        """Advance the run's `kind` counter by `count`; returns the new (last allocated) value."""
        for attempt in range(3):
            try:
                doc = await self._counters.find_one_and_update(
                    {'_id': f'{kind}/{run_id}'},
                    {'$inc': {'value': count}},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            except DuplicateKeyError:
                if attempt == 2:
                    raise
                continue  # two first upserts raced on the new counter document: retry as an update
            assert doc is not None
            return cast(int, doc['value'])
        raise AssertionError('unreachable')

    # -- runs ---------------------------------------------------------------------------------

    async def insert_run(self, tx: Any, op: ops.InsertRun) -> ops.RunRow | None:
        doc = run_document(op.row)
        while True:
            try:
                await self._runs.insert_one(doc)
                return None
            except DuplicateKeyError:
                existing = await self._runs.find_one({'_id': op.row.run_id})
                if existing is not None:
                    return run_row(existing)
                # deleted meanwhile: insert again

    async def get_run(self, tx: Any, op: ops.GetRun) -> ops.RunRow | None:
        doc = await self._runs.find_one({'_id': op.run_id})
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
        cursor = self._runs.find(query, sort=[('started_at_us', direction), ('_id', direction)])
        if op.limit is not None:
            cursor = cursor.limit(op.limit)
        return [run_row(doc) async for doc in cursor]

    async def list_run_ids(self, tx: Any, op: ops.ListRunIds) -> list[str]:
        found = {str(i) for i in await self._runs.distinct('_id')}
        return list(found | {str(i) for i in await self._snapshots.distinct('run_id')})

    async def delete_run(self, tx: Any, op: ops.DeleteRun) -> bool:
        """Every collection's documents of the run: snapshots before the message nodes they name, so
        a reader never finds a snapshot whose nodes are gone, and the run document last, so a delete
        stopped half way leaves the run listed and deleting it again finishes the job."""
        run_id = op.run_id
        deleted = (await self._snapshots.delete_many({'run_id': run_id})).deleted_count
        deleted += (await self._snapshot_keys.delete_many({'_id.run_id': run_id})).deleted_count
        for collection in (self._nodes, self._events, self._effects):
            deleted += (await collection.delete_many({'run_id': run_id})).deleted_count
        # The node counter stays: a node id is never handed out twice for a run id, so a store that
        # still remembers the deleted run's messages cannot mistake a new run's node for its own.
        counters = [f'{kind}/{run_id}' for kind in ('events', 'snapshots')]
        deleted += (await self._counters.delete_many({'_id': {'$in': counters}})).deleted_count
        deleted += (await self._runs.delete_one({'_id': run_id})).deleted_count
        return deleted > 0

    # -- events and ledger --------------------------------------------------------------------

    async def put_events(self, tx: Any, op: ops.PutEvents) -> None:
        run_id = op.run_id
        keys = list({r.idempotency_key for r in op.rows if r.idempotency_key is not None})
        seen: set[str] = set()
        if keys:
            found = self._events.find({'run_id': run_id, 'idempotency_key': {'$in': keys}}, projection={'_id': 0})
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
        first = await self._next_seq('events', run_id, len(fresh)) - len(fresh) + 1
        docs = [event_document(run_id, row, first + offset) for offset, row in enumerate(fresh)]
        while docs:
            try:
                await self._events.insert_many(docs, ordered=True)
                return
            except BulkWriteError as error:
                # The insert stopped at its first error. A keyed event that breaks the unique index
                # was appended meanwhile by a concurrent writer: already applied, go on after it.
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
        found = self._events.find(query, sort=[('seq', order)], limit=op.limit or 0)
        rows = [event_row(doc) async for doc in found]
        return rows[::-1] if order == DESCENDING else rows

    async def put_effects(self, tx: Any, op: ops.PutEffects) -> None:
        """Replace-or-insert each ledger entry, in order, in one bulk write."""
        replacements = [({'run_id': r.run_id, 'tool_call_id': r.tool_call_id}, effect_document(r)) for r in op.rows]
        for attempt in range(3):
            try:
                await replace_all(self._effects, replacements, ordered=True)
                return
            except BulkWriteError as error:
                errors = _write_errors(error)
                racing = errors and all(e.get('code') == _DUPLICATE_KEY for e in errors)
                if attempt == 2 or not racing:
                    raise
                # concurrent first writes raced on the unique index: replay the batch as replaces
                # (replaying the entries before the failed one rewrites the same documents)

    async def list_effects(self, tx: Any, op: ops.ListEffects) -> list[ops.EffectRow]:
        query: Document = {'run_id': op.run_id}
        if op.tool_call_id is not None:
            query['tool_call_id'] = op.tool_call_id
        return [effect_row(doc) async for doc in self._effects.find(query, sort=_BY_START)]

    # -- snapshots ----------------------------------------------------------------------------

    async def snapshot_key_applied(self, tx: Any, op: ops.SnapshotKeyApplied) -> bool:
        """A key document, or a snapshot carrying the key (a save stopped before its key document)."""
        key_id = {'run_id': op.run_id, 'key': op.key}
        if await self._snapshot_keys.find_one({'_id': key_id}, projection={'_id': 1}) is not None:
            return True
        found = await self._snapshots.find_one({'run_id': op.run_id, 'idempotency_key': op.key}, projection={'_id': 1})
        return found is not None

    async def node_exists(self, tx: Any, op: ops.NodeExists) -> bool:
        found = await self._nodes.find_one({'run_id': op.run_id, 'n': op.node, 'part': 0}, projection={'_id': 1})
        return found is not None

    async def snapshot_states(self, tx: Any, op: ops.SnapshotStates) -> list[tuple[int, str]]:
        found = self._snapshots.find({'run_id': op.run_id}, projection={'_id': 0, 'seq': 1, 'state': 1})
        return [(cast(int, d['seq']), cast(str, d['state'])) async for d in found]

    async def put_snapshot(self, tx: Any, op: ops.PutSnapshot) -> list[int]:
        """Nodes, then the snapshot document, then the key document; `KeyConflict` when the snapshot
        or key document breaks its unique index (the key was recorded meanwhile)."""
        run_id = op.run_id
        nodes: list[int] = []
        if op.bodies:
            last = await self._next_seq('nodes', run_id, len(op.bodies))
            nodes = list(range(last - len(op.bodies) + 1, last + 1))
            await self._nodes.insert_many(node_documents(run_id, nodes, op.parent, op.bodies), ordered=True)
        self.boundary('put_snapshot:nodes')
        seq = await self._next_seq('snapshots', run_id)
        head = nodes[-1] if nodes else op.parent
        doc = snapshot_document(run_id, op.row, key=op.key, seq=seq, head=head)
        try:
            inserted = await self._snapshots.insert_one(doc)
        except DuplicateKeyError:
            if op.key is None:
                raise
            raise KeyConflict(op.key) from None
        self.boundary('put_snapshot:row')
        if op.key is not None:
            try:
                await self._snapshot_keys.insert_one({'_id': {'run_id': run_id, 'key': op.key}, 'seq': seq})
            except DuplicateKeyError:
                # recorded by a writer whose snapshot is pruned already: this one must not stay
                await self._snapshots.delete_one({'_id': inserted.inserted_id})
                raise KeyConflict(op.key) from None
        return nodes

    async def delete_snapshots(self, tx: Any, op: ops.DeleteSnapshots) -> None:
        await self._snapshots.delete_many({'run_id': op.run_id, 'seq': {'$in': list(op.seqs)}})

    async def list_snapshots(self, tx: Any, op: ops.ListSnapshots) -> list[ops.SnapshotRow]:
        query: Document = {'run_id': op.run_id}
        if op.complete_only:
            query['state'] = SnapshotState.COMPLETE.value
        if op.newest:
            doc = await self._snapshots.find_one(query, sort=[('seq', DESCENDING)])
            return [snapshot_row(doc)] if doc is not None else []
        return [snapshot_row(doc) async for doc in self._snapshots.find(query, sort=[('seq', ASCENDING)])]

    async def get_nodes(self, tx: Any, op: ops.GetNodes) -> Mapping[int, ops.Node]:
        """The run's nodes up to the highest head: a chain only reaches back to older (lower) nodes."""
        heads = [head for head, _ in op.chains]
        if not heads:
            return {}
        return nodes_from([doc async for doc in self._nodes.find({'run_id': op.run_id, 'n': {'$lte': max(heads)}})])


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
    Writes are not transactions: see the module docstring for their order.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT, ENCRYPTION, CHECKSUMS}
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
        check_max_snapshots(max_snapshots_per_run)
        MediaWalker(None, media_threshold_bytes)
        check_media_store(media_store, owner=type(self).__name__)
        ClientUser.__init__(self, 'MongoStepStore', client, db_url, database)
        media = resolve_media_store(
            media_store,
            default=lambda: MongoMediaStore(client=self.client, database=self.database_name),
            owner=type(self).__name__,
        )
        EngineStore.__init__(
            self,
            MongoPort(self.database),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media,
            media_threshold_bytes=media_threshold_bytes,
            encryption=encryption,
        )

    async def aclose(self) -> None:
        """Close the client if this store created it from `db_url`; a given client stays open."""
        await ClientUser.aclose(self)
