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
import hashlib
import json
from collections.abc import Mapping
from typing import Any, ClassVar, cast

from bson.binary import Binary
from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, DuplicateKeyError

from stepcore.features import PERSISTENT
from stepcore.media import (
    EMPTY_CONTEXT,
    MediaContext,
    MediaStore,
    PublicUrlResolver,
    digest_of_uri,
    media_uri,
    resolve_public_url,
)
from stepcore.setup_once import SetupOnce

from .client import AsyncClient, ClientUser, Document
from .indexes import ensure_indexes

__all__ = ('DEFAULT_CHUNK_SIZE_BYTES', 'MAX_CHUNK_SIZE_BYTES', 'MongoMediaStore')

DEFAULT_CHUNK_SIZE_BYTES = 8 * 1024 * 1024
MAX_CHUNK_SIZE_BYTES = 15 * 1024 * 1024
"""Largest accepted chunk: leaves room for the chunk document's other fields under 16 MiB."""

_DUPLICATE_KEY = 11000


class MongoMediaStore(ClientUser, MediaStore):
    """Blobs in a MongoDB database, deduplicated by their sha256 digest.

    Pass a shared client as `client=` (never closed by this store: a `pymongo.AsyncMongoClient` or
    any object with its async API, as for `MongoStepStore`) or a connection string as `db_url=`
    (the store owns that client: `await store.aclose()`).
    Each blob is held whole in memory on put and get.
    """

    features: ClassVar[frozenset[str]] = frozenset({PERSISTENT})

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
        self._use_client('MongoMediaStore', client, db_url, database)
        self.collection_name = collection
        self.chunk_size_bytes = chunk_size_bytes
        self.public_url_resolver = public_url
        self._manifests: AsyncCollection[Document] = self._db[collection]
        self._chunks: AsyncCollection[Document] = self._db[f'{collection}_chunks']
        self._ensure_indexes = SetupOnce(self._create_indexes)

    async def _create_indexes(self) -> None:
        await ensure_indexes(
            self._chunks, [IndexModel([('digest', ASCENDING), ('n', ASCENDING)], unique=True, name='digest_n')]
        )

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        uri = media_uri(data)
        digest = digest_of_uri(uri)
        if await self._manifests.find_one({'_id': digest}, projection={'_id': 1}) is not None:
            return uri
        await self._ensure_indexes()
        size = self.chunk_size_bytes
        count = max(1, -(-len(data) // size))
        chunks = [{'digest': digest, 'n': n, 'data': Binary(data[n * size : (n + 1) * size])} for n in range(count)]
        try:
            await self._chunks.insert_many(chunks, ordered=False)
        except BulkWriteError as error:
            # Chunks left by an earlier, interrupted put of the same bytes are identical: keep them.
            write_errors = cast(list[Mapping[str, Any]], error.details.get('writeErrors', []))
            if error.details.get('writeConcernErrors') or any(e.get('code') != _DUPLICATE_KEY for e in write_errors):
                raise
        manifest: Document = {
            '_id': digest,
            'length': len(data),
            'chunk_size': size,
            'chunks': count,
            'media_type': context.media_type,
            'filename': context.filename,
            'metadata': json.dumps(dict(context.metadata), ensure_ascii=False) if context.metadata else None,
        }
        with contextlib.suppress(DuplicateKeyError):  # a concurrent put of the same bytes finished first
            await self._manifests.insert_one(manifest)
        return uri

    async def _manifest(self, uri: str) -> Document | None:
        return await self._manifests.find_one({'_id': digest_of_uri(uri)})

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        manifest = await self._manifest(uri)
        if manifest is None:
            raise LookupError(f'no blob stored at {uri} in MongoDB collection {self._manifests.full_name!r}')
        digest = cast(str, manifest['_id'])
        count = cast(int, manifest['chunks'])
        pieces: list[bytes] = []
        async for chunk in self._chunks.find({'digest': digest}, sort=[('n', ASCENDING)]):
            if chunk['n'] != len(pieces):
                break
            pieces.append(bytes(chunk['data']))
        data = b''.join(pieces)
        if len(pieces) != count or len(data) != manifest['length'] or hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(
                f'blob {uri} in {self._chunks.full_name!r} is damaged: expected {count} chunks and '
                f'{manifest["length"]} bytes, found {len(pieces)} chunks and {len(data)} bytes, or the digest '
                'does not match; put the original bytes again to repair it'
            )
        return data

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        return await self._manifests.find_one({'_id': digest_of_uri(uri)}, projection={'_id': 1}) is not None

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        digest_of_uri(uri)
        return await resolve_public_url(self.public_url_resolver, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str] | None:
        manifest = await self._manifest(uri)
        if manifest is None or manifest.get('metadata') is None:
            return None
        return cast(dict[str, str], json.loads(cast(str, manifest['metadata'])))
