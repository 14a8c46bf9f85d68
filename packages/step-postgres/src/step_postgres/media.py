"""`PostgresMediaStore`: content-addressed blobs in one PostgreSQL table."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, ClassVar

from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

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
)

from ._pool import CONNECT_TIMEOUT_SECONDS, PoolHandle
from .schema import DEFAULT_TABLE_PREFIX, MEDIA, Tables, ensure_schema

__all__ = ('PostgresMediaStore',)

_LIST_PAGE = 1000


class _PostgresBlobs(BlobPort):
    """The blob port of `PostgresMediaStore`: one row per blob in `<table_prefix>_media`."""

    def __init__(self, handle: PoolHandle, tables: Tables, *, owns_handle: bool) -> None:
        self.__handle = handle
        self.__owns_handle = owns_handle
        self.__tables = tables
        self.__ensure = SetupOnce(self.__create_schema)
        q = tables.query
        self.__q_put = q(
            """INSERT INTO {media} (digest, data, media_type, metadata, stored_at) VALUES (%s, %s, %s, %s::json, %s)
            ON CONFLICT (digest) DO UPDATE SET stored_at = excluded.stored_at"""
        )
        self.__q_get = q('SELECT data FROM {media} WHERE digest = %s')
        self.__q_meta = q('SELECT metadata FROM {media} WHERE digest = %s')
        self.__q_list = q(
            'SELECT digest, stored_at, length(data) FROM {media} WHERE digest > %s ORDER BY digest LIMIT '
            + str(_LIST_PAGE)
        )
        self.__q_delete = q('DELETE FROM {media} WHERE digest = %s')
        self.__q_delete_old = q('DELETE FROM {media} WHERE digest = %s AND stored_at < %s')

    async def __create_schema(self) -> None:
        async with self.__handle.connection() as conn:
            await ensure_schema(conn, self.__tables, MEDIA)

    async def __fetch_value(self, query: Any, digest: str) -> tuple[bool, Any]:
        await self.__ensure()
        async with self.__handle.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(query, (digest,))
            row = await cur.fetchone()
        return (False, None) if row is None else (True, row[0])

    def where(self) -> str:
        return f'table {self.__tables.name("media")!r}'

    async def put(self, ref: BlobRef, data: bytes, meta: BlobMeta, stored_us: int) -> None:
        await self.__ensure()
        async with self.__handle.connection() as conn:
            await conn.execute(self.__q_put, (ref.digest, data, meta.media_type, meta.text, from_micros(stored_us)))

    async def get(self, ref: BlobRef) -> bytes | None:
        found, value = await self.__fetch_value(self.__q_get, ref.digest)
        return bytes(value) if found else None

    async def head(self, ref: BlobRef) -> BlobHead | None:
        found, value = await self.__fetch_value(self.__q_meta, ref.digest)
        return BlobHead(metadata=value) if found else None

    async def list(self) -> AsyncIterator[ListedBlob]:
        await self.__ensure()
        after = ''
        while True:
            async with self.__handle.connection() as conn:
                cur = conn.cursor(row_factory=tuple_row)
                await cur.execute(self.__q_list, (after,))
                rows = await cur.fetchall()
            for digest, stored_at, size in rows:
                yield ListedBlob(digest=digest, stored_at=stored_at, size=int(size))
            if len(rows) < _LIST_PAGE:
                return
            after = rows[-1][0]

    async def delete(self, ref: BlobRef, location: object, older_than: datetime | None) -> bool:
        await self.__ensure()
        async with self.__handle.connection() as conn:
            if older_than is None:
                cur = await conn.execute(self.__q_delete, (ref.digest,))
            else:
                cur = await conn.execute(self.__q_delete_old, (ref.digest, older_than))
            return cur.rowcount > 0

    async def aclose(self) -> None:
        """Close the pool if the store opened it from a DSN; a given or shared pool is left open."""
        if self.__owns_handle:
            await self.__handle.close()


class PostgresMediaStore(MediaEngine):
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
        handle = (
            _handle
            if _handle is not None
            else PoolHandle(pool=pool, dsn=dsn, owner='PostgresMediaStore', connect_timeout=connect_timeout)
        )
        self.__handle = handle
        super().__init__(_PostgresBlobs(handle, self.tables, owns_handle=_handle is None), public_url=public_url)

    @property
    def pool(self) -> AsyncConnectionPool[Any] | None:
        """The connection pool in use (`None` until a DSN-built pool is first opened)."""
        return self.__handle.pool
