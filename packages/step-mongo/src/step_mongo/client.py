"""Choosing the `AsyncMongoClient` and database a store works on."""

from __future__ import annotations

from datetime import UTC
from typing import Any, cast

from bson.codec_options import CodecOptions
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

__all__ = (
    'CODEC_OPTIONS',
    'DEFAULT_DATABASE',
    'ClientUser',
    'Document',
    'MongoClient',
    'open_client',
    'resolve_database',
)

Document = dict[str, Any]
MongoClient = AsyncMongoClient[Any]
"""Any async client: the stores read through their own codec options, whatever the client's are."""

DEFAULT_DATABASE = 'stepcore'
"""Database used when neither `database=` nor the connection string names one."""

CODEC_OPTIONS: CodecOptions[Document] = CodecOptions(document_class=dict, tz_aware=True, tzinfo=UTC)
"""How the stores decode documents, independent of a shared client's own codec options."""


def open_client(owner: str, client: MongoClient | None, db_url: str | None) -> tuple[MongoClient, bool]:
    """The client to use and whether the store owns it (created it from `db_url`)."""
    if client is not None and db_url is not None:
        raise ValueError(f'{owner} takes client= or db_url=, not both: pass a shared client or a connection string')
    if client is not None:
        if not isinstance(cast(object, client), AsyncMongoClient):
            raise TypeError(
                f'{owner} needs a pymongo AsyncMongoClient as client=, got {type(client).__name__}: '
                'create one with pymongo.AsyncMongoClient(url) or pass db_url= instead'
            )
        return client, False
    if db_url is None:
        raise ValueError(
            f'{owner} needs client= (a shared pymongo AsyncMongoClient) or db_url= (a connection string such as '
            "'mongodb://127.0.0.1:27017')"
        )
    if not db_url.startswith(('mongodb://', 'mongodb+srv://')):
        raise ValueError(
            f"{owner} got db_url={db_url!r}: expected a 'mongodb://' or 'mongodb+srv://' connection string"
        )
    return AsyncMongoClient[Document](db_url), True


def resolve_database(client: MongoClient, database: str | None) -> AsyncDatabase[Document]:
    """`database`, else the one named in the connection string, else `DEFAULT_DATABASE`."""
    if database is not None:
        if not database or any(c in database for c in '/\\. "$\x00'):
            raise ValueError(
                f'database={database!r} is not a valid MongoDB database name: use a non-empty name without '
                '/ \\ . space " $ or NUL'
            )
        return cast(AsyncDatabase[Document], client.get_database(database, codec_options=CODEC_OPTIONS))
    return cast(
        AsyncDatabase[Document], client.get_default_database(default=DEFAULT_DATABASE, codec_options=CODEC_OPTIONS)
    )


class ClientUser:
    """The client and database a store works on, and whether closing the store closes the client.

    `MongoStepStore` and `MongoMediaStore` share this: a given `client=` is never closed by the
    store, a client the store created from `db_url=` is closed by `aclose()`.
    """

    _client: MongoClient
    _owns_client: bool
    _db: AsyncDatabase[Document]

    def _use_client(self, owner: str, client: MongoClient | None, db_url: str | None, database: str | None) -> None:
        self._client, self._owns_client = open_client(owner, client, db_url)
        self._db = resolve_database(self._client, database)

    @property
    def client(self) -> MongoClient:
        """The `AsyncMongoClient` this store uses."""
        return self._client

    @property
    def database_name(self) -> str:
        return self._db.name

    async def aclose(self) -> None:
        """Close the client if this store created it from `db_url`; a given client stays open."""
        if self._owns_client:
            await self._client.close()
