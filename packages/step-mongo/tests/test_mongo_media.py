"""MongoMediaStore behaviour specific to MongoDB, against the server at STEP_MONGO_URL."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator

import pytest

from step_mongo.client import MongoClient
from step_mongo.media import MongoMediaStore
from stepcore.media import MediaContext, media_uri

MIB = 1024 * 1024


@pytest.fixture
async def media(mongo_client: MongoClient, db_name: str) -> AsyncIterator[MongoMediaStore]:
    store = MongoMediaStore(client=mongo_client, database=db_name)
    yield store
    await store.aclose()


async def test_a_blob_bigger_than_a_document_is_chunked(
    media: MongoMediaStore, mongo_client: MongoClient, db_name: str
):
    data = hashlib.sha256(b'seed').digest() * (17 * MIB // 32) + b'tail'
    uri = await media.put(data, context=MediaContext(media_type='application/octet-stream'))
    assert uri == media_uri(data)
    db = mongo_client[db_name]
    digest = uri.removeprefix('media+sha256://')
    manifest = await db['media'].find_one({'_id': digest})
    assert manifest is not None
    assert manifest['length'] == len(data)
    assert manifest['chunks'] == 3
    assert manifest['media_type'] == 'application/octet-stream'
    assert await db['media_chunks'].count_documents({'digest': digest}) == 3
    assert await media.get(uri) == data

    assert await media.put(data) == uri  # deduplicated: nothing new is written
    assert await db['media'].count_documents({}) == 1
    assert await db['media_chunks'].count_documents({}) == 3


async def test_chunk_index_and_collection_names(mongo_client: MongoClient, db_name: str):
    store = MongoMediaStore(client=mongo_client, database=db_name, collection='blobs', chunk_size_bytes=4)
    uri = await store.put(b'0123456789')
    db = mongo_client[db_name]
    assert sorted(await db.list_collection_names()) == ['blobs', 'blobs_chunks']
    info = await db['blobs_chunks'].index_information()
    assert list(info['digest_n']['key']) == [('digest', 1), ('n', 1)]
    assert info['digest_n']['unique'] is True
    assert await db['blobs_chunks'].count_documents({}) == 3
    assert await store.get(uri) == b'0123456789'


async def test_metadata_is_a_json_string_with_any_keys(media: MongoMediaStore, mongo_client: MongoClient, db_name: str):
    metadata = {'a.b': '1', '$c': '2', 'ünï': '3'}
    uri = await media.put(b'payload', context=MediaContext(media_type='text/plain', metadata=metadata))
    raw = await mongo_client[db_name]['media'].find_one({})
    assert raw is not None
    assert isinstance(raw['metadata'], str)
    assert json.loads(raw['metadata']) == metadata
    assert raw['media_type'] == 'text/plain'
    assert await media.get_metadata(uri) == metadata
    plain = await media.put(b'no metadata')
    assert await media.get_metadata(plain) is None


async def test_an_interrupted_put_is_completed_by_the_next(
    media: MongoMediaStore, mongo_client: MongoClient, db_name: str
):
    data = b'abcdefgh' * 4
    small = MongoMediaStore(client=mongo_client, database=db_name, chunk_size_bytes=8)
    uri = await small.put(data)
    db = mongo_client[db_name]
    digest = uri.removeprefix('media+sha256://')
    # Simulate a put that stopped after some chunks: no manifest, chunks 2 and 3 missing.
    await db['media'].delete_one({'_id': digest})
    await db['media_chunks'].delete_many({'digest': digest, 'n': {'$gte': 2}})
    assert not await small.exists(uri)
    with pytest.raises(LookupError):
        await small.get(uri)
    assert await small.put(data) == uri
    assert await small.get(uri) == data
    assert await db['media_chunks'].count_documents({'digest': digest}) == 4


async def test_a_damaged_blob_is_reported(media: MongoMediaStore, mongo_client: MongoClient, db_name: str):
    small = MongoMediaStore(client=mongo_client, database=db_name, chunk_size_bytes=4)
    uri = await small.put(b'0123456789')
    await mongo_client[db_name]['media_chunks'].delete_one({'n': 1})
    with pytest.raises(ValueError, match='is unparsable: its 4 stored bytes'):
        await small.get(uri)


async def test_missing_blob_and_bad_uri(media: MongoMediaStore):
    uri = media_uri(b'never stored')
    assert not await media.exists(uri)
    with pytest.raises(LookupError, match='media not found'):
        await media.get(uri)
    with pytest.raises(ValueError, match='media\\+sha256'):
        await media.get('http://example.invalid/x')


async def test_public_url_uses_the_resolver(mongo_client: MongoClient, db_name: str):
    async def resolver(uri: str, context: MediaContext) -> str:
        return f'https://cdn.invalid/{uri.removeprefix("media+sha256://")}?type={context.media_type}'

    store = MongoMediaStore(client=mongo_client, database=db_name, public_url=resolver)
    uri = await store.put(b'img')
    url = await store.public_url(uri, context=MediaContext(media_type='image/png'))
    assert url is not None
    assert url.endswith('?type=image/png')
    plain = MongoMediaStore(client=mongo_client, database=db_name)
    assert await plain.public_url(uri) is None


async def test_owned_and_shared_clients(mongo_url: str, mongo_client: MongoClient, db_name: str):
    shared = MongoMediaStore(client=mongo_client, database=db_name)
    await shared.aclose()
    assert (await mongo_client.admin.command('ping'))['ok'] == 1
    owned = MongoMediaStore(db_url=mongo_url, database=db_name)
    uri = await owned.put(b'x')
    await owned.aclose()
    assert await shared.get(uri) == b'x'


def test_chunk_size_is_bounded():
    with pytest.raises(ValueError, match='chunk_size_bytes=0'):
        MongoMediaStore(db_url='mongodb://127.0.0.1:1', chunk_size_bytes=0)
    with pytest.raises(ValueError, match='16 MiB'):
        MongoMediaStore(db_url='mongodb://127.0.0.1:1', chunk_size_bytes=16 * MIB)
