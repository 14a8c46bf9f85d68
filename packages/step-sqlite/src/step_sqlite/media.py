"""`SqliteMediaStore`: content-addressed blobs in a table of a SQLite database."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, cast

from stepcore.features import MEDIA_COLLECTION, PERSISTENT
from stepcore.media import (
    EMPTY_CONTEXT,
    MediaContext,
    MediaStore,
    PublicUrlResolver,
    StoredMedia,
    digest_of_uri,
    media_uri,
    resolve_public_url,
    uri_of_digest,
)
from stepcore.models import utcnow

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


class SqliteMediaStore(MediaStore):
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
    ) -> None:
        self.table = _check_table(table)
        db = Database.given(database, connection, owner=type(self).__name__, timeout=timeout, synchronous=synchronous)
        self._db = db
        self._public_url = public_url
        component = media_component(self.table)
        db.add_setup(component.name, lambda conn: ensure_schema(conn, component, where=db.describe))
        self._insert = (
            f'INSERT INTO {self.table} (digest, data, size, media_type, metadata, created_at, stored_us) '
            'VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO UPDATE SET stored_us = excluded.stored_us'
        )

    @classmethod
    def on_database(cls, db: Database, *, public_url: PublicUrlResolver | None = None) -> SqliteMediaStore:
        """A media store on another store's connection (sharing its lock; never closes it)."""
        return cls(db, public_url=public_url)

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        uri = media_uri(data)
        digest = digest_of_uri(uri)
        metadata = json.dumps(dict(context.metadata), ensure_ascii=False) if context.metadata else None
        row = (
            digest,
            bytes(data),
            len(data),
            context.media_type,
            metadata,
            utcnow().isoformat(),
            time.time_ns() // 1000,
        )

        def work(connection: sqlite3.Connection) -> None:
            with write_transaction(connection):
                connection.execute(self._insert, row)

        try:
            await self._db.run(work)
        except sqlite3.Error as error:
            # the driver's own words (e.g. "attempt to write a readonly database") stay the message
            error.add_note(f'{type(self).__name__} on {self._db.describe}, storing media blob {uri}')
            raise
        return uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        digest = digest_of_uri(uri)
        sql = f'SELECT data FROM {self.table} WHERE digest = ?'
        row = await self._db.run(lambda conn: conn.execute(sql, (digest,)).fetchone())
        if row is None:
            raise LookupError(f'no media blob {uri!r} in table {self.table!r} of {self._db.describe}')
        return bytes(row[0])

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        digest = digest_of_uri(uri)
        sql = f'SELECT 1 FROM {self.table} WHERE digest = ?'
        return await self._db.run(lambda conn: conn.execute(sql, (digest,)).fetchone()) is not None

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        digest_of_uri(uri)
        return await resolve_public_url(self._public_url, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str] | None:
        digest = digest_of_uri(uri)
        sql = f'SELECT metadata FROM {self.table} WHERE digest = ?'
        row = await self._db.run(lambda conn: conn.execute(sql, (digest,)).fetchone())
        if row is None:
            raise LookupError(f'no media blob {uri!r} in table {self.table!r} of {self._db.describe}')
        if row[0] is None:
            return None
        value = json.loads(row[0])
        if not isinstance(value, dict):
            raise ValueError(f'media blob {uri!r} has malformed metadata {row[0]!r}: expected a JSON object')
        return {str(k): str(v) for k, v in cast(dict[Any, Any], value).items()}

    async def list_media(self) -> AsyncIterator[StoredMedia]:
        """Every blob, with when it was last put, read a thousand rows at a time."""
        sql = f'SELECT digest, stored_us, size FROM {self.table} WHERE digest > ? ORDER BY digest LIMIT {_LIST_PAGE}'
        after = ''
        while True:
            rows = await self._db.run(lambda conn, a=after: conn.execute(sql, (a,)).fetchall())
            for digest, stored_us, size in rows:
                yield StoredMedia(
                    uri=uri_of_digest(digest),
                    stored_at=datetime.fromtimestamp(stored_us / 1_000_000, UTC),
                    size=int(size),
                )
            if len(rows) < _LIST_PAGE:
                return
            after = rows[-1][0]

    async def delete_media(self, uri: str, *, older_than: datetime | None = None) -> bool:
        """Remove the blob; with `older_than`, only while it was last put before then."""
        digest = digest_of_uri(uri)
        if older_than is None:
            sql, params = f'DELETE FROM {self.table} WHERE digest = ?', (digest,)
        else:
            cutoff = int(older_than.timestamp() * 1_000_000)
            sql, params = f'DELETE FROM {self.table} WHERE digest = ? AND stored_us < ?', (digest, cutoff)

        def work(connection: sqlite3.Connection) -> bool:
            with write_transaction(connection):
                return connection.execute(sql, params).rowcount > 0

        return await self._db.run(work)

    async def aclose(self) -> None:
        """Close the connection when this store opened it (a given connection stays open)."""
        await self._db.aclose()
