"""`MongoMediaStore`: content-addressed blobs in MongoDB, chunked so any size fits.

Each blob has a manifest document in `<collection>` (`_id` = hex sha256, length, chunk count,
media type, metadata as a JSON string) and its bytes in `<collection>_chunks`, one document per
`chunk_size_bytes` slice keyed by `(digest, n)`. Chunks are written before the manifest, so a
manifest always describes complete data; a put interrupted half way leaves only chunks, which the
next put of the same bytes completes. GridFS is not used because its file ids are not the content
digest, which would lose deduplication.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any, ClassVar, cast

from bson.binary import Binary
from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError

from stepcore.backend import (
    MEDIA_COLLECTION,
    PERSISTENT,
    BlobHead,
    BlobMeta,
    BlobPort,
    BlobRef,
    ListedBlob,
    MediaEngine,
    PublicUrlResolver,
    SetupOnce,
    from_micros,
    micros,
    now_micros,
)

from .client import AsyncClient, ClientUser, Document
from .compat import replace_all
from .indexes import ensure_indexes

__all__ = ('DEFAULT_CHUNK_SIZE_BYTES', 'MAX_CHUNK_SIZE_BYTES', 'MongoMediaStore')

DEFAULT_CHUNK_SIZE_BYTES = 8 * 1024 * 1024
MAX_CHUNK_SIZE_BYTES = 15 * 1024 * 1024
"""Largest accepted chunk: leaves room for the chunk document's other fields under 16 MiB."""

_DUPLICATE_KEY = 11000
_LIST_BATCH = 1000


class _MongoBlobs(BlobPort):
    """The blob port of `MongoMediaStore`: a manifest per blob and its bytes in chunk documents."""

    def __init__(self, database: AsyncDatabase[Document], collection: str, chunk_size: int) -> None:
        self.__manifests: AsyncCollection[Document] = database[collection]
        self.__chunks: AsyncCollection[Document] = database[f'{collection}_chunks']
        self.__chunk_size = chunk_size
        self.__ensure_indexes = SetupOnce(self.__create_indexes)

    async def __create_indexes(self) -> None:
        await ensure_indexes(
            self.__chunks, [IndexModel([('digest', ASCENDING), ('n', ASCENDING)], unique=True, name='digest_n')]
        )

    def where(self) -> str:
        return f'MongoDB collection {self.__manifests.full_name!r}'

    async def put(self, ref: BlobRef, data: bytes, meta: BlobMeta, stored_us: int) -> None:
        digest = ref.digest
        refreshed = await self.__manifests.update_one(
            {'_id': digest, 'removing': {'$exists': False}}, {'$set': {'stored_us': stored_us}}
        )
        if refreshed.matched_count:
            return  # already stored: it now counts as put now
        await self.__ensure_indexes()
        size = self.__chunk_size
        count = max(1, -(-len(data) // size))
        generation = uuid.uuid4().hex
        chunks = [
            (
                {'digest': digest, 'n': n},
                {'digest': digest, 'n': n, 'gen': generation, 'data': Binary(data[n * size : (n + 1) * size])},
            )
            for n in range(count)
        ]
        try:
            await replace_all(self.__chunks, chunks, ordered=False)
        except BulkWriteError as error:
            # A concurrent put of the same bytes upserted a chunk first: it holds the same slice.
            write_errors = cast(list[Mapping[str, Any]], error.details.get('writeErrors', []))
            if error.details.get('writeConcernErrors') or any(e.get('code') != _DUPLICATE_KEY for e in write_errors):
                raise
        manifest: Document = {
            '_id': digest,
            'length': len(data),
            'chunk_size': size,
            'chunks': count,
            'media_type': meta.media_type,
            'filename': meta.filename,
            'metadata': meta.text,
            'gen': generation,
            'stored_us': now_micros(),
        }
        with contextlib.suppress(DuplicateKeyError):  # a concurrent put of the same bytes finished first
            await self.__manifests.replace_one({'_id': digest}, manifest, upsert=True)

    async def get(self, ref: BlobRef) -> bytes | None:
        manifest = await self.__manifests.find_one({'_id': ref.digest}, projection={'chunks': 1})
        if manifest is None:
            return None
        count = cast(int, manifest['chunks'])
        pieces: list[bytes] = []
        async for chunk in self.__chunks.find({'digest': ref.digest, 'n': {'$lt': count}}, sort=[('n', ASCENDING)]):
            if chunk['n'] != len(pieces):
                break  # a chunk is missing: the bytes read are not the blob's, which the engine reports
            pieces.append(bytes(chunk['data']))
        return b''.join(pieces)

    async def head(self, ref: BlobRef) -> BlobHead | None:
        manifest = await self.__manifests.find_one({'_id': ref.digest}, projection={'metadata': 1})
        return None if manifest is None else BlobHead(metadata=cast(str | None, manifest.get('metadata')))

    async def list(self) -> AsyncIterator[ListedBlob]:
        projection = {'_id': 1, 'length': 1, 'stored_us': 1}
        async for manifest in self.__manifests.find({}, projection=projection, batch_size=_LIST_BATCH):
            stored_us = manifest.get('stored_us')
            yield ListedBlob(
                digest=cast(str, manifest['_id']),
                stored_at=from_micros(stored_us if isinstance(stored_us, int) else None),
                size=int(cast(int, manifest.get('length', 0))),
            )

    async def delete(self, ref: BlobRef, location: object, older_than: datetime | None) -> bool:
        digest = ref.digest
        claim: Document = {'_id': digest, 'removing': {'$exists': False}}
        if older_than is not None:
            # A manifest written before collection existed has no time: it counts as put long ago.
            claim['$or'] = [{'stored_us': {'$lt': micros(older_than)}}, {'stored_us': {'$exists': False}}]
        token = uuid.uuid4().hex
        marked = await self.__manifests.find_one_and_update(claim, {'$set': {'removing': token}})
        if marked is None:
            return False
        # From here a put finds no manifest it may refresh, and writes the blob under a new generation.
        removed = await self.__manifests.delete_one({'_id': digest, 'removing': token})
        if not removed.deleted_count:
            return False  # a put replaced the manifest meanwhile
        await self.__chunks.delete_many({'digest': digest, 'gen': marked.get('gen')})
        return True


class MongoMediaStore(ClientUser, MediaEngine):
    """Blobs in a MongoDB database, deduplicated by their sha256 digest.

    Pass a shared client as `client=` (never closed by this store: a `pymongo.AsyncMongoClient` or
    any object with its async API, as for `MongoStepStore`) or a connection string as `db_url=`
    (the store owns that client: `await store.aclose()`).
    Each blob is held whole in memory on put and get.

    Garbage collection (`media_collection`): a manifest's `stored_us` is when the blob was last
    put (microseconds since the epoch; a put of stored bytes updates it). Each full write stamps
    its chunks and manifest with a generation of its own. `delete_media` first marks the manifest
    as being removed (only while it is still old), then deletes it, then the chunks of its
    generation, so a put racing with the removal either refreshed the manifest before the mark
    (and the blob stays) or writes the blob anew, under a generation the removal never touches.
    """

    features: ClassVar[frozenset[str]] = frozenset({PERSISTENT, MEDIA_COLLECTION})

    def __init__(
        self,
        *,
        client: AsyncClient | None = None,
        db_url: str | None = None,
        database: str | None = None,
        collection: str = 'media',
        chunk_size_bytes: int = DEFAULT_CHUNK_SIZE_BYTES,
        public_url: PublicUrlResolver | None = None,
    ) -> None:
        if not collection or '$' in collection or '\x00' in collection or collection.startswith('system.'):
            raise ValueError(f'collection={collection!r} is not a usable MongoDB collection name')
        size = cast(object, chunk_size_bytes)
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_CHUNK_SIZE_BYTES:
            raise ValueError(
                f'chunk_size_bytes={chunk_size_bytes!r} must be an integer from 1 to {MAX_CHUNK_SIZE_BYTES} '
                '(15 MiB, so a chunk document stays under the 16 MiB BSON limit)'
            )
        ClientUser.__init__(self, 'MongoMediaStore', client, db_url, database)
        self.collection_name = collection
        self.chunk_size_bytes = chunk_size_bytes
        MediaEngine.__init__(self, _MongoBlobs(self.database, collection, chunk_size_bytes), public_url=public_url)
