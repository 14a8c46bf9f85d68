"""`SqliteMediaStore`: content-addressed blobs in a table of a SQLite database."""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import AsyncIterator
from datetime import datetime
from typing import ClassVar, cast

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
    from_micros,
    micros,
    utcnow,
)

from .connection import Database, Synchronous, write_transaction
from .schema import ensure_schema, media_component

__all__ = ('SqliteMediaStore',)

_LIST_PAGE = 1000
_IDENTIFIER = re.compile(r'[A-Za-z_][A-Za-z0-9_]{0,62}')


def _check_table(table: str) -> str:
    if (
        not isinstance(cast(object, table), str)
        or not _IDENTIFIER.fullmatch(table)
        or table.lower().startswith('sqlite_')
    ):
        raise ValueError(
            f'table={table!r} is not a usable table name: use 1-63 of A-Z a-z 0-9 _ , not starting with a digit '
            "or 'sqlite_'"
        )
    return table


class _SqliteBlobs(BlobPort):
    """The blob port of `SqliteMediaStore`: one row per blob in `table`, on a `Database`."""

    def __init__(self, db: Database, table: str, owner: str) -> None:
        self.__db = db
        self.__table = table
        self.__owner = owner
        self.__insert = (
            f'INSERT INTO {table} (digest, data, size, media_type, metadata, created_at, stored_us) '
            'VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO UPDATE SET stored_us = excluded.stored_us'
        )

    def where(self) -> str:
        return f'table {self.__table!r} of {self.__db.describe}'

    async def put(self, ref: BlobRef, data: bytes, meta: BlobMeta, stored_us: int) -> None:
        row = (ref.digest, data, len(data), meta.media_type, meta.text, utcnow().isoformat(), stored_us)

        def work(connection: sqlite3.Connection) -> None:
            with write_transaction(connection):
                connection.execute(self.__insert, row)

        try:
            await self.__db.run(work)
        except sqlite3.Error as error:
            # the driver's own words (e.g. "attempt to write a readonly database") stay the message
            error.add_note(f'{self.__owner} on {self.__db.describe}, storing media blob {ref.uri}')
            raise

    async def get(self, ref: BlobRef) -> bytes | None:
        sql = f'SELECT data FROM {self.__table} WHERE digest = ?'
        row = await self.__db.run(lambda conn: conn.execute(sql, (ref.digest,)).fetchone())
        return None if row is None else bytes(row[0])

    async def head(self, ref: BlobRef) -> BlobHead | None:
        sql = f'SELECT metadata FROM {self.__table} WHERE digest = ?'
        row = await self.__db.run(lambda conn: conn.execute(sql, (ref.digest,)).fetchone())
        return None if row is None else BlobHead(metadata=row[0])

    async def list(self) -> AsyncIterator[ListedBlob]:
        sql = f'SELECT digest, stored_us, size FROM {self.__table} WHERE digest > ? ORDER BY digest LIMIT {_LIST_PAGE}'
        after = ''
        while True:
            rows = await self.__db.run(lambda conn, a=after: conn.execute(sql, (a,)).fetchall())
            for digest, stored_us, size in rows:
                yield ListedBlob(digest=digest, stored_at=from_micros(stored_us), size=int(size))
            if len(rows) < _LIST_PAGE:
                return
            after = rows[-1][0]

    async def delete(self, ref: BlobRef, location: object, older_than: datetime | None) -> bool:
        params: tuple[str, ...] | tuple[str, int]
        if older_than is None:
            sql, params = f'DELETE FROM {self.__table} WHERE digest = ?', (ref.digest,)
        else:
            sql, params = (
                f'DELETE FROM {self.__table} WHERE digest = ? AND stored_us < ?',
                (ref.digest, micros(older_than)),
            )

        def work(connection: sqlite3.Connection) -> bool:
            with write_transaction(connection):
                return connection.execute(sql, params).rowcount > 0

        return await self.__db.run(work)

    async def aclose(self) -> None:
        """Close the connection when the store opened it (a given connection stays open)."""
        await self.__db.aclose()


class SqliteMediaStore(MediaEngine):
    """One row per blob, keyed by its sha256 digest; a second put of the same bytes is a no-op.

    `metadata` from the `MediaContext` is kept as a JSON column and `media_type` in its own column.
    Pass `database=` (a file path; the store opens and closes its own connection) or `connection=`
    (an open `sqlite3.Connection` created with `check_same_thread=False`, which the store never
    closes); another step-sqlite store's `Database` as `database=` shares its connection.
    `public_url=` turns a `media+sha256://` URI into a URL a model can fetch.

    Garbage collection (`media_collection`): the `stored_us` column holds when a blob was last put
    (a put of stored bytes updates it and nothing else); `list_media` pages through the table by
    digest and `delete_media` removes a row only while it is still that old, in one statement.
    """

    features: ClassVar[frozenset[str]] = frozenset({PERSISTENT, MEDIA_COLLECTION})

    def __init__(
        self,
        database: str | os.PathLike[str] | Database | None = None,
        *,
        connection: sqlite3.Connection | None = None,
        public_url: PublicUrlResolver | None = None,
        table: str = 'media',
        timeout: float = 30.0,
        synchronous: Synchronous = 'NORMAL',
        full_fsync: bool | None = None,
    ) -> None:
        self.table = _check_table(table)
        db = Database.given(
            database,
            connection,
            owner=type(self).__name__,
            timeout=timeout,
            synchronous=synchronous,
            full_fsync=full_fsync,
        )
        component = media_component(self.table)
        db.add_setup(component.name, lambda conn: ensure_schema(conn, component, where=db.describe))
        MediaEngine.__init__(self, _SqliteBlobs(db, self.table, type(self).__name__), public_url=public_url)

    @classmethod
    def on_database(cls, db: Database, *, public_url: PublicUrlResolver | None = None) -> SqliteMediaStore:
        """A media store on another store's connection (sharing its lock; never closes it)."""
        return cls(db, public_url=public_url)
