"""`MongoStepStore`: runs, events, snapshots and the tool-effect ledger in MongoDB.

Collections (all in one database):

- `runs`: one document per run, `_id` = run id (registration is an atomic insert).
- `events`: one document per step event, with a per-run `seq`.
- `snapshots`: one small document per snapshot: its header fields plus `head` and `length`, which
  name the run's message nodes the snapshot consists of.
- `message_nodes`: one document per stored message (`run_id`, `n`, `parent`, `body`), written once;
  see `stepcore.history` for the incremental scheme. A body too large for one document continues
  in further documents with the same `n` and `part` 1, 2, ...
- `snapshot_idempotency_keys`: applied snapshot keys, kept when pruning deletes snapshots.
- `tool_effects`: one document per `(run_id, tool_call_id)`, replaced on each update.
- `counters`: per-run sequence counters, advanced with an atomic `$inc`.

Indexes are created once per store, on its first write.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final, cast

from bson.binary import Binary
from pymongo import ASCENDING, DESCENDING, IndexModel, ReplaceOne, ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, DuplicateKeyError

from stepcore.codec import dump_record, load_record
from stepcore.features import MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION
from stepcore.history import HistoryDelta, HistoryIndex, walk_chain
from stepcore.media import MediaStore
from stepcore.models import (
    ContinuableSnapshot,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.protocols import StepStore, StepWrite
from stepcore.registration import check_registration
from stepcore.retention import check_max_snapshots, snapshots_to_prune
from stepcore.setup_once import SetupOnce
from stepcore.walker import DEFAULT_MEDIA_THRESHOLD_BYTES, MediaWalker
from stepcore.writes import check_writes

from .client import ClientUser, Document, MongoClient
from .indexes import ensure_indexes
from .media import MongoMediaStore

__all__ = ('NODE_PIECE_BYTES', 'MongoStepStore', 'check_field_names')

logger = logging.getLogger(__name__)

NODE_PIECE_BYTES: Final = 8 * 1024 * 1024
"""Largest message body slice held by one node document (MongoDB caps a document at 16 MiB)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICROSECOND = timedelta(microseconds=1)
_STRING_KEY = {'idempotency_key': {'$type': 'string'}}
_DUPLICATE_KEY = 11000
"""MongoDB's error code for a write that breaks a unique index."""


class _DefaultMedia:
    def __repr__(self) -> str:
        return '<MongoMediaStore on the same client>'


_DEFAULT_MEDIA: Final = _DefaultMedia()


def check_field_names(what: str, mapping: Mapping[str, Any]) -> None:
    """Raise `ValueError` for keys MongoDB cannot store as field names of a nested document."""
    for key in mapping:
        problem = None
        if '\x00' in key:
            problem = 'contains a NUL byte'
        elif key.startswith('$'):
            problem = "starts with '$'"
        elif '.' in key:
            problem = "contains '.'"
        if problem is not None:
            raise ValueError(
                f'{what} key {key!r} {problem}: MongoStepStore stores metadata as a nested document, whose field '
                "names cannot contain NUL or '.' or start with '$'; rename the key (for example replace '.' "
                "with '_')"
            )


def _as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _micros(value: datetime) -> int:
    return (_as_utc(value) - _EPOCH) // _ONE_MICROSECOND


def _from_micros(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def _put_times(doc: Document, record: Any, fields: Iterable[str]) -> None:
    # BSON dates hold milliseconds: the `_us` twin keeps the exact instant and breaks ties in sorts.
    for name in fields:
        value = cast(datetime, getattr(record, name))
        doc[name] = _as_utc(value)
        doc[f'{name}_us'] = _micros(value)


def _take_times(doc: Document, fields: Iterable[str]) -> None:
    for name in fields:
        doc[name] = _from_micros(cast(int, doc.pop(f'{name}_us')))


def _drop_none(doc: Document, fields: Iterable[str]) -> None:
    # Absent rather than null, so the sparse lineage indexes hold only runs that have the field.
    for name in fields:
        if doc.get(name) is None:
            doc.pop(name, None)


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


class MongoStepStore(ClientUser, StepStore):
    """Step persistence in MongoDB through pymongo's native async client.

    Pass a shared `pymongo.AsyncMongoClient` as `client=` (never closed by this store) or a
    connection string as `db_url=` (the store owns that client: `await store.aclose()`).
    `database` defaults to the one named in the connection string, else `stepcore`.

    By default, binary content and strings of `media_threshold_bytes` or more are externalized to
    a `MongoMediaStore` on the same client and database; pass `media_store=None` to keep them
    inline, or any other `MediaStore`.
    """

    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT})

    def __init__(
        self,
        *,
        client: MongoClient | None = None,
        db_url: str | None = None,
        database: str | None = None,
        media_store: MediaStore | _DefaultMedia | None = _DEFAULT_MEDIA,
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
    ) -> None:
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        walker = MediaWalker(None, media_threshold_bytes)  # validates the threshold before connecting
        self._use_client('MongoStepStore', client, db_url, database)
        if isinstance(media_store, _DefaultMedia):
            media_store = MongoMediaStore(client=self._client, database=self._db.name)
        self.media_store: MediaStore | None = media_store
        walker.media_store = media_store
        self._history = HistoryIndex(walker)
        self._runs: AsyncCollection[Document] = self._db['runs']
        self._events: AsyncCollection[Document] = self._db['events']
        self._snapshots: AsyncCollection[Document] = self._db['snapshots']
        self._snapshot_keys: AsyncCollection[Document] = self._db['snapshot_idempotency_keys']
        self._effects: AsyncCollection[Document] = self._db['tool_effects']
        self._counters: AsyncCollection[Document] = self._db['counters']
        self._nodes: AsyncCollection[Document] = self._db['message_nodes']
        self._ensure_indexes = SetupOnce(self._create_indexes)

    # -- setup ------------------------------------------------------------------------------

    async def _create_indexes(self) -> None:
        for name, models in _INDEXES.items():
            await ensure_indexes(self._db[name], models)

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

    # -- runs -------------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        check_field_names('RunRecord.metadata', record.metadata)
        await self._ensure_indexes()
        doc = dump_record(record)
        doc['_id'] = doc.pop('run_id')
        _put_times(doc, record, ('started_at',))
        _drop_none(doc, ('conversation_id', 'parent_run_id'))
        while True:
            try:
                await self._runs.insert_one(doc)
                return
            except DuplicateKeyError:
                existing = await self.get_run(record.run_id)
                if existing is not None:
                    check_registration(existing, record)
                    return

    @staticmethod
    def _load_run(doc: Document) -> RunRecord:
        data = dict(doc)
        run_id = data.pop('_id')
        _take_times(data, ('started_at',))
        return load_record(RunRecord, data, run_id=run_id)

    async def get_run(self, run_id: str) -> RunRecord | None:
        doc = await self._runs.find_one({'_id': run_id})
        return self._load_run(doc) if doc is not None else None

    async def list_runs(
        self, *, conversation_id: str | None = None, parent_run_id: str | None = None
    ) -> list[RunRecord]:
        query: Document = {}
        if conversation_id is not None:
            query['conversation_id'] = conversation_id
        if parent_run_id is not None:
            query['parent_run_id'] = parent_run_id
        cursor = self._runs.find(query, sort=[('started_at', ASCENDING), ('started_at_us', ASCENDING)])
        return [self._load_run(doc) async for doc in cursor]

    # -- events -----------------------------------------------------------------------------

    async def append_event(self, event: StepEvent) -> None:
        check_field_names('StepEvent.metadata', event.metadata)
        await self._ensure_indexes()
        await self._append_events(event.run_id, [event])

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        """Upsert ledger entries and append events, then save `snapshot`, in a few round trips.

        The ledger entries go in one ordered bulk write; per run, one query finds the idempotency
        keys already applied, one counter update allocates the events' seqs and one insert appends
        them. Not atomic (like separate calls): MongoDB gives no transaction without a replica set.
        """
        checked = check_writes(writes)
        events: dict[str, list[StepEvent]] = {}
        effects: list[ToolEffectRecord] = []
        for write in checked:
            if isinstance(write, StepEvent):
                check_field_names('StepEvent.metadata', write.metadata)
                events.setdefault(write.run_id, []).append(write)
            else:
                effects.append(write)
        await self._ensure_indexes()
        if effects:
            await self._upsert_effects(effects)
        for run_id, run_events in events.items():
            await self._append_events(run_id, run_events)
        if snapshot is not None:
            await self.save_snapshot(snapshot)

    async def _append_events(self, run_id: str, events: list[StepEvent]) -> None:
        """Append `events` of one run in order, skipping idempotency keys already applied."""
        keys = list({e.idempotency_key for e in events if e.idempotency_key is not None})
        seen: set[str] = set()
        if keys:
            cursor = self._events.find({'run_id': run_id, 'idempotency_key': {'$in': keys}}, projection={'_id': 0})
            seen = {cast(str, doc['idempotency_key']) async for doc in cursor}
        fresh: list[StepEvent] = []
        for event in events:
            key = event.idempotency_key
            if key is not None:
                if key in seen:
                    continue
                seen.add(key)
            fresh.append(event)
        if not fresh:
            return
        first = await self._next_seq('events', run_id, len(fresh)) - len(fresh) + 1
        docs: list[Document] = []
        for offset, event in enumerate(fresh):
            doc = dump_record(event, exclude={'seq'})
            doc['seq'] = first + offset
            _put_times(doc, event, ('timestamp',))
            docs.append(doc)
        try:
            await self._events.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            # A concurrent append with the same key won: that one is suppressed. Anything else is raised.
            details = cast(dict[str, Any], exc.details)
            errors = cast(list[dict[str, Any]], details.get('writeErrors', []))
            if details.get('writeConcernErrors') or any(
                error.get('code') != _DUPLICATE_KEY or fresh[int(error['index'])].idempotency_key is None
                for error in errors
            ):
                raise

    async def list_events(self, run_id: str) -> list[StepEvent]:
        events: list[StepEvent] = []
        async for doc in self._events.find({'run_id': run_id}, sort=[('seq', ASCENDING)]):
            doc.pop('_id')
            _take_times(doc, ('timestamp',))
            events.append(load_record(StepEvent, doc))
        return events

    # -- snapshots --------------------------------------------------------------------------

    async def _snapshot_key_applied(self, run_id: str, key: str) -> bool:
        found = await self._snapshot_keys.find_one({'_id': {'run_id': run_id, 'key': key}}, projection={'_id': 1})
        return found is not None

    async def _write_nodes(self, delta: HistoryDelta) -> list[int]:
        count = len(delta.new_messages)
        if not count:
            return []
        last = await self._next_seq('nodes', delta.run_id, count)
        ids = list(range(last - count + 1, last + 1))
        docs: list[Document] = []
        parent = delta.parent
        for node, body in zip(ids, delta.new_messages, strict=True):
            pieces = [body[i : i + NODE_PIECE_BYTES] for i in range(0, len(body), NODE_PIECE_BYTES)] or [b'']
            docs.append(
                {
                    'run_id': delta.run_id,
                    'n': node,
                    'part': 0,
                    'parent': parent,
                    'parts': len(pieces),
                    'body': Binary(pieces[0]),
                }
            )
            docs.extend(
                {'run_id': delta.run_id, 'n': node, 'part': i, 'body': Binary(piece)}
                for i, piece in enumerate(pieces[1:], start=1)
            )
            parent = node
        await self._nodes.insert_many(docs, ordered=True)
        return ids

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        check_field_names('ContinuableSnapshot.metadata', snapshot.metadata)
        await self._ensure_indexes()
        run_id = snapshot.run_id
        key = snapshot.idempotency_key
        if key is not None and await self._snapshot_key_applied(run_id, key):
            return
        delta = await self._history.delta(run_id, snapshot.messages)
        node_ids = await self._write_nodes(delta)
        self._history.commit(delta, node_ids)
        doc = dump_record(snapshot, exclude={'messages', 'seq'})
        doc['seq'] = await self._next_seq('snapshots', run_id)
        doc['head'] = self._history.head(delta, node_ids)
        doc['length'] = delta.total
        _put_times(doc, snapshot, ('created_at',))
        try:
            await self._snapshots.insert_one(doc)
        except DuplicateKeyError:
            if key is None:
                raise
            return  # a concurrent save with the same key won
        if key is not None:
            with contextlib.suppress(DuplicateKeyError):
                await self._snapshot_keys.insert_one({'_id': {'run_id': run_id, 'key': key}, 'seq': doc['seq']})
        if self.max_snapshots_per_run is not None:
            await self._prune(run_id)

    async def _prune(self, run_id: str) -> None:
        cursor = self._snapshots.find({'run_id': run_id}, projection={'_id': 0, 'seq': 1, 'state': 1})
        kept = [(cast(int, d['seq']), cast(str, d['state'])) async for d in cursor]
        prune = snapshots_to_prune(kept, self.max_snapshots_per_run)
        if prune:
            await self._snapshots.delete_many({'run_id': run_id, 'seq': {'$in': prune}})

    async def _load_nodes(self, run_id: str, max_head: int | None) -> dict[int, tuple[int | None, bytes]]:
        """Nodes of the run up to `max_head` (every chain ending at or below it lies in that range)."""
        if max_head is None:
            return {}
        heads: dict[int, Document] = {}
        extra: dict[int, dict[int, bytes]] = {}
        async for doc in self._nodes.find({'run_id': run_id, 'n': {'$lte': max_head}}, projection={'_id': 0}):
            node = cast(int, doc['n'])
            if doc['part'] == 0:
                heads[node] = doc
            else:
                extra.setdefault(node, {})[cast(int, doc['part'])] = bytes(doc['body'])
        nodes: dict[int, tuple[int | None, bytes]] = {}
        for node, doc in heads.items():
            body = bytes(doc['body'])
            parts = cast(int, doc.get('parts', 1))
            if parts > 1:
                rest = extra.get(node, {})
                missing = [i for i in range(1, parts) if i not in rest]
                if missing:
                    raise LookupError(
                        f'stored message node {node} of run {run_id!r} is missing continuation parts {missing}'
                    )
                body += b''.join(rest[i] for i in range(1, parts))
            nodes[node] = (cast(int | None, doc['parent']), body)
        return nodes

    async def _materialize(self, doc: Document, nodes: Mapping[int, tuple[int | None, bytes]]) -> ContinuableSnapshot:
        run_id = cast(str, doc['run_id'])

        def lookup(node: object) -> tuple[int | None, bytes]:
            try:
                return nodes[cast(int, node)]
            except KeyError:
                raise LookupError(f'stored history of run {run_id!r} is missing message node {node!r}') from None

        bodies = walk_chain(doc['head'], cast(int, doc['length']), lookup)
        messages = await self._history.decode(bodies)
        data = {k: v for k, v in doc.items() if k not in ('_id', 'head', 'length')}
        _take_times(data, ('created_at',))
        return load_record(ContinuableSnapshot, data, messages=messages)

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        query: Document = {'run_id': run_id}
        if not include_interrupted:
            query['state'] = SnapshotState.COMPLETE.value
        doc = await self._snapshots.find_one(query, sort=[('seq', DESCENDING)])
        if doc is None:
            return None
        return await self._materialize(doc, await self._load_nodes(run_id, doc['head']))

    async def list_snapshots(self, run_id: str) -> list[ContinuableSnapshot]:
        docs = [doc async for doc in self._snapshots.find({'run_id': run_id}, sort=[('seq', ASCENDING)])]
        heads = [cast(int, d['head']) for d in docs if d.get('head') is not None]
        nodes = await self._load_nodes(run_id, max(heads) if heads else None)
        snapshots: list[ContinuableSnapshot] = []
        for doc in docs:
            try:
                snapshots.append(await self._materialize(doc, nodes))
            except ValueError:
                logger.exception('skipping unreadable snapshot seq=%s of run %r', doc.get('seq'), run_id)
        return snapshots

    # -- tool effects -----------------------------------------------------------------------

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self._ensure_indexes()
        await self._upsert_effects([record])

    async def _upsert_effects(self, records: list[ToolEffectRecord]) -> None:
        """Replace-or-insert each ledger entry, in order, in one bulk write."""
        operations: list[ReplaceOne[Document]] = []
        for record in records:
            doc = dump_record(record, exclude={'args'})
            # Tool arguments are arbitrary JSON whose keys need not be valid BSON field names.
            doc['args_json'] = json.dumps(record.model_dump(mode='json', include={'args'})['args'], ensure_ascii=False)
            _put_times(doc, record, ('started_at', 'updated_at'))
            query = {'run_id': record.run_id, 'tool_call_id': record.tool_call_id}
            operations.append(ReplaceOne(query, doc, upsert=True))
        for attempt in range(3):
            try:
                await self._effects.bulk_write(operations, ordered=True)
                return
            except BulkWriteError as exc:
                details = cast(dict[str, Any], exc.details)
                errors = cast(list[dict[str, Any]], details.get('writeErrors', []))
                racing = errors and all(error.get('code') == _DUPLICATE_KEY for error in errors)
                if attempt == 2 or not racing or details.get('writeConcernErrors'):
                    raise
                # concurrent first writes raced on the unique index: replay the batch as replaces
                # (replaying the entries before the failed one rewrites the same documents)

    @staticmethod
    def _load_effect(doc: Document) -> ToolEffectRecord:
        data = dict(doc)
        data.pop('_id', None)
        _take_times(data, ('started_at', 'updated_at'))
        data['args'] = json.loads(cast(str, data.pop('args_json', 'null')))
        return load_record(ToolEffectRecord, data)

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        doc = await self._effects.find_one({'run_id': run_id, 'tool_call_id': tool_call_id})
        return self._load_effect(doc) if doc is not None else None

    async def _effects_where(self, query: Document) -> list[ToolEffectRecord]:
        cursor = self._effects.find(query, sort=[('started_at', ASCENDING), ('started_at_us', ASCENDING)])
        return [self._load_effect(doc) async for doc in cursor]

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return await self._effects_where({'run_id': run_id})

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return await self._effects_where({'run_id': run_id, 'status': ToolEffectStatus.STARTED.value})

    # -- lifecycle --------------------------------------------------------------------------
