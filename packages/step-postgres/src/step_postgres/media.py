"""`PostgresMediaStore`: content-addressed blobs in one PostgreSQL table."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any, ClassVar, cast

from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from stepcore.features import MEDIA_COLLECTION, PERSISTENT
from stepcore.media import (
    EMPTY_CONTEXT,
    MediaContext,
    PublicUrlResolver,
    StoredMedia,
    digest_of_uri,
    media_uri,
    resolve_public_url,
    uri_of_digest,
)
from stepcore.models import utcnow
from stepcore.setup_once import SetupOnce

from ._pool import CONNECT_TIMEOUT_SECONDS, PoolHandle
from .schema import DEFAULT_TABLE_PREFIX, MEDIA, Tables, ensure_schema

__all__ = ('PostgresMediaStore',)

_LIST_PAGE = 1000


class PostgresMediaStore:
    """Blobs in `<table_prefix>_media`, one row per sha256 digest.

    Pass `pool=` to share an `AsyncConnectionPool` you open and close yourself, or `dsn=` for a
    pool the store opens on first use and closes in `aclose()`. A blob already stored is not
    written again (its first `media_type` and metadata are kept), so concurrent writers of the same
    content never conflict.

    Garbage collection (`media_collection`): `stored_at` holds when a blob was last put, from the
    writing process's clock (a put of stored bytes updates only that column); `list_media` pages
    through the table by digest and `delete_media` removes a row only while it is still that old.
    """

    features: ClassVar[frozenset[str]] = frozenset({PERSISTENT, MEDIA_COLLECTION})

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        dsn: str | None = None,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        public_url: PublicUrlResolver | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        _handle: PoolHandle | None = None,
    ) -> None:
        self.tables = Tables(table_prefix)
        self.table_prefix = table_prefix
        self._owns_handle = _handle is None
        self._handle = (
            _handle
            if _handle is not None
            else PoolHandle(pool=pool, dsn=dsn, owner='PostgresMediaStore', connect_timeout=connect_timeout)
        )
        self._public_url = public_url
        self._ensure = SetupOnce(self._create_schema)
        q = self.tables.query
        self._q_put = q(
            """INSERT INTO {media} (digest, data, media_type, metadata, stored_at) VALUES (%s, %s, %s, %s::json, %s)
            ON CONFLICT (digest) DO UPDATE SET stored_at = excluded.stored_at"""
        )
        self._q_get = q('SELECT data FROM {media} WHERE digest = %s')
        self._q_exists = q('SELECT EXISTS (SELECT 1 FROM {media} WHERE digest = %s)')
        self._q_meta = q('SELECT metadata FROM {media} WHERE digest = %s')
        self._q_list = q(
            'SELECT digest, stored_at, length(data) FROM {media} WHERE digest > %s ORDER BY digest LIMIT '
            + str(_LIST_PAGE)
        )
        self._q_delete = q('DELETE FROM {media} WHERE digest = %s')
        self._q_delete_old = q('DELETE FROM {media} WHERE digest = %s AND stored_at < %s')

    @property
    def pool(self) -> AsyncConnectionPool[Any] | None:
        """The connection pool in use (`None` until a DSN-built pool is first opened)."""
        return self._handle.pool

    async def _create_schema(self) -> None:
        async with self._handle.connection() as conn:
            await ensure_schema(conn, self.tables, MEDIA)

    async def _fetch_value(self, query: Any, digest: str) -> tuple[bool, Any]:
        await self._ensure()
        async with self._handle.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(query, (digest,))
            row = await cur.fetchone()
        return (False, None) if row is None else (True, row[0])

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        """Store `data` once per content and return its `media+sha256://` URI."""
        uri = media_uri(data)
        metadata = json.dumps(dict(context.metadata), ensure_ascii=False) if context.metadata else None
        await self._ensure()
        async with self._handle.connection() as conn:
            await conn.execute(self._q_put, (digest_of_uri(uri), data, context.media_type, metadata, utcnow()))
        return uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        """The bytes stored at `uri`; `LookupError` when there are none."""
        found, value = await self._fetch_value(self._q_get, digest_of_uri(uri))
        if not found:
            raise LookupError(f'no media stored at {uri!r} in table {self.tables.name("media")!r}')
        return bytes(value)

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        """Whether a blob is stored at `uri`."""
        _, value = await self._fetch_value(self._q_exists, digest_of_uri(uri))
        return bool(value)

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        """The configured resolver's URL for `uri`, else `None`."""
        digest_of_uri(uri)
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str] | None:
        """The metadata stored with the blob; `None` when it had none; `LookupError` when absent."""
        found, value = await self._fetch_value(self._q_meta, digest_of_uri(uri))
        if not found:
            raise LookupError(f'no media stored at {uri!r} in table {self.tables.name("media")!r}')
        if value is None:
            return None
        return {str(k): str(v) for k, v in cast(dict[str, Any], value).items()}

    async def list_media(self) -> AsyncIterator[StoredMedia]:
        """Every blob, with when it was last put, read a thousand rows at a time."""
        await self._ensure()
        after = ''
        while True:
            async with self._handle.connection() as conn:
                cur = conn.cursor(row_factory=tuple_row)
                await cur.execute(self._q_list, (after,))
                rows = await cur.fetchall()
            for digest, stored_at, size in rows:
                yield StoredMedia(uri=uri_of_digest(digest), stored_at=stored_at, size=int(size))
            if len(rows) < _LIST_PAGE:
                return
            after = rows[-1][0]

    async def delete_media(self, uri: str, *, older_than: datetime | None = None) -> bool:
        """Remove the blob; with `older_than`, only while it was last put before then (one statement)."""
        digest = digest_of_uri(uri)
        await self._ensure()
        async with self._handle.connection() as conn:
            if older_than is None:
                cur = await conn.execute(self._q_delete, (digest,))
            else:
                cur = await conn.execute(self._q_delete_old, (digest, older_than))
            return cur.rowcount > 0

    async def aclose(self) -> None:
        """Close the pool if this store opened it from a DSN; a given or shared pool is left open."""
        if self._owns_handle:
            await self._handle.close()
