"""Connection fixtures: every test talks to the MongoDB server named by `STEP_MONGO_URL`.

Start a local one with `export STEP_MONGO_URL="$(scripts/mongo-server.sh start)"`, or point the
variable at any MongoDB (for example `mongodb://127.0.0.1:27017` for a mongo:8 container).
Without a reachable server the tests fail; they never skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from bson.binary import Binary
from pymongo import ASCENDING, AsyncMongoClient
from pymongo.errors import PyMongoError

from step_mongo.client import CODEC_OPTIONS, Document, MongoClient
from step_mongo.store import MongoStepStore

URL_VARIABLE = 'STEP_MONGO_URL'
_HOW_TO = (
    'start a local server with `export STEP_MONGO_URL="$(scripts/mongo-server.sh start)"` or set '
    'STEP_MONGO_URL to a MongoDB connection string such as mongodb://127.0.0.1:27017'
)


@pytest.fixture(scope='session')
def mongo_url() -> str:
    url = os.environ.get(URL_VARIABLE)
    if not url:
        pytest.fail(f'{URL_VARIABLE} is not set: the step-mongo tests need a MongoDB server; {_HOW_TO}', pytrace=False)
    return url


@pytest.fixture
async def mongo_client(mongo_url: str) -> AsyncIterator[MongoClient]:
    """A client for the test's own use (stores under test get `db_url=` or this client)."""
    client: MongoClient = AsyncMongoClient[Document](mongo_url, serverSelectionTimeoutMS=5000)
    try:
        await client.admin.command('ping')
    except PyMongoError as error:
        await client.close()
        pytest.fail(
            f'cannot reach the MongoDB server at {URL_VARIABLE}={mongo_url!r}: {error}; {_HOW_TO}', pytrace=False
        )
    yield client
    await client.close()


@pytest.fixture
async def db_name(mongo_client: MongoClient) -> AsyncIterator[str]:
    """A fresh database name, dropped after the test."""
    name = f'stepcore_test_{uuid.uuid4().hex}'
    yield name
    await mongo_client.drop_database(name)


Damage = Callable[[MongoStepStore, str, str, int | str | None, bytes], Awaitable[None]]

_RECORDS = {'run': 'runs', 'event': 'events', 'effect': 'tool_effects', 'snapshot': 'snapshots'}


async def damage_record(
    store: MongoStepStore, kind: str, run_id: str, ident: int | str | None, replacement: bytes
) -> None:
    """Overwrite the stored body of one record of `run_id` with `replacement`, in the database itself.

    `kind`: 'run' (ident None), 'event' / 'snapshot' (ident = seq), 'effect' (ident = tool_call_id),
    or 'message' (ident = a marker text: every message node of the run whose body holds it).
    """
    db = store.client.get_database(store.database_name, codec_options=CODEC_OPTIONS)
    if kind == 'message':
        await _damage_messages(db['message_nodes'], run_id, str(ident), replacement)
        return
    query: dict[str, Any] = {'_id': run_id} if kind == 'run' else {'run_id': run_id}
    if kind in ('event', 'snapshot'):
        query['seq'] = ident
    elif kind == 'effect':
        query['tool_call_id'] = ident
    result = await db[_RECORDS[kind]].update_one(query, {'$set': {'body': replacement.decode()}})
    assert result.matched_count == 1, f'no {kind} {ident!r} of run {run_id!r} in database {db.name!r}'


async def _damage_messages(nodes: Any, run_id: str, marker: str, replacement: bytes) -> None:
    bodies: dict[int, bytes] = {}
    async for doc in nodes.find({'run_id': run_id}, sort=[('n', ASCENDING), ('part', ASCENDING)]):
        bodies[doc['n']] = bodies.get(doc['n'], b'') + bytes(doc['body'])
    hit = [n for n, body in bodies.items() if marker.encode() in body]
    assert hit, f'no stored message of run {run_id!r} holds {marker!r}'
    for n in hit:
        await nodes.update_one(
            {'run_id': run_id, 'n': n, 'part': 0}, {'$set': {'body': Binary(replacement), 'parts': 1}}
        )
        await nodes.delete_many({'run_id': run_id, 'n': n, 'part': {'$gt': 0}})


async def damage_media(store: object, uri: str, replacement: bytes) -> None:
    """The kit's media damage hook for `MongoMediaStore`: the blob's bytes become `replacement`, all in
    its first chunk."""
    from step_mongo.media import MongoMediaStore

    assert isinstance(store, MongoMediaStore)
    chunks = store.database[f'{store.collection_name}_chunks']
    digest = uri.removeprefix('media+sha256://')
    changed = await chunks.update_one({'digest': digest, 'n': 0}, {'$set': {'data': Binary(replacement)}})
    assert changed.matched_count == 1, f'no chunk of {uri} to damage'
    await chunks.delete_many({'digest': digest, 'n': {'$gt': 0}})


@pytest.fixture
def mongo_media_damage() -> Callable[[object, str, bytes], Awaitable[None]]:
    """The conformance kit's `media_damage` hook for `MongoMediaStore` (see `damage_media`)."""
    return damage_media


@pytest.fixture
def mongo_damage() -> Damage:
    """The conformance kit's damage hook for `MongoStepStore` (see `damage_record`)."""
    return damage_record
