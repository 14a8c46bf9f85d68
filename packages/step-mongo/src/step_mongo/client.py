"""Choosing the async MongoDB client and database a store works on.

A store takes any client with pymongo's async API: a `pymongo.AsyncMongoClient`, or another object
that hands out databases whose collections have the async collection methods (`insert_one`,
`find`, `bulk_write`, ...) — a driver's wrapper, a proxy that adds tracing, a Motor client, or
mongomock-motor's in-memory `AsyncMongoMockClient` for tests (see `compat` for how the stores adapt
to it). Databases are obtained with `get_database(name, codec_options=...)` when the client has it,
else with `client[name]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast

from bson.codec_options import CodecOptions
from pymongo import AsyncMongoClient
from pymongo import MongoClient as SyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from .compat import is_mongomock, is_synchronous_mongomock

__all__ = (
    'CODEC_OPTIONS',
    'DEFAULT_DATABASE',
    'AsyncClient',
    'ClientUser',
    'Document',
    'MongoClient',
    'check_client',
    'open_client',
    'resolve_database',
)

Document = dict[str, Any]
MongoClient = AsyncMongoClient[Any]
"""pymongo's async client: the stores read through their own codec options, whatever the client's are."""


class AsyncClient(Protocol):
    """What a store needs of a client given as `client=`: databases by name, with pymongo's async
    collection API (`AsyncMongoClient` is one; so is any object that delegates to one)."""

    def __getitem__(self, name: str, /) -> Any: ...


DEFAULT_DATABASE = 'stepcore'
"""Database used when neither `database=` nor the connection string names one."""

CODEC_OPTIONS: CodecOptions[Document] = CodecOptions(document_class=dict, tz_aware=True)
"""How the stores decode documents, independent of a shared client's own codec options."""


def check_client(owner: str, client: object) -> AsyncClient:
    """`client` when it can hand out databases (`get_database` or `client[name]`); `TypeError` otherwise.

    pymongo's synchronous `MongoClient` (and mongomock's) is refused by name: its collection methods
    do not return awaitables, so every store call would fail later, far from the cause.
    """
    if isinstance(client, AsyncMongoClient):
        return cast(AsyncClient, client)
    kind = type(client).__name__
    if isinstance(client, SyncMongoClient):
        raise TypeError(
            f'{owner} got a synchronous pymongo.MongoClient as client=: the store is async, pass a '
            'pymongo.AsyncMongoClient (or db_url=) instead'
        )
    if is_synchronous_mongomock(client):
        raise TypeError(
            f"{owner} got mongomock's synchronous {kind} as client=: the store is async, pass "
            "mongomock_motor.AsyncMongoMockClient (mongomock-motor's async client over mongomock) instead"
        )
    if isinstance(client, str | bytes):
        raise TypeError(
            f'{owner} got a {kind} as client=: pass a connection string as db_url=, or a '
            'pymongo.AsyncMongoClient as client='
        )
    hands_out_databases = callable(getattr(client, 'get_database', None)) or callable(
        getattr(type(client), '__getitem__', None)
    )
    if hands_out_databases and not isinstance(client, Sequence):
        return cast(AsyncClient, client)
    raise TypeError(
        f'{owner} needs an async MongoDB client as client=, got {kind}: pass a '
        'pymongo.AsyncMongoClient, an object with its get_database(name) / client[name] API whose collections '
        'are async, or db_url= instead'
    )


def open_client(owner: str, client: object | None, db_url: str | None) -> tuple[AsyncClient, bool]:
    """The client to use and whether the store owns it (created it from `db_url`).

    Exactly one of `client` and `db_url` is taken: both or neither is a `ValueError` whose message
    says "exactly one" (the phrase pydantic-ai-harness's stores use, which callers match on).
    """
    if client is not None and db_url is not None:
        raise ValueError(
            f'{owner} takes exactly one of client= or db_url=, not both: pass a shared client or a connection string'
        )
    if client is not None:
        return check_client(owner, client), False
    if db_url is None:
        raise ValueError(
            f'{owner} needs exactly one of client= or db_url=, got neither: pass client= (a shared pymongo '
            "AsyncMongoClient) or db_url= (a connection string such as 'mongodb://127.0.0.1:27017')"
        )
    if not db_url.startswith(('mongodb://', 'mongodb+srv://')):
        raise ValueError(
            f"{owner} got db_url={db_url!r}: expected a 'mongodb://' or 'mongodb+srv://' connection string"
        )
    return cast(AsyncClient, AsyncMongoClient[Document](db_url)), True


def _check_name(database: str) -> str:
    if not database or any(c in database for c in '/\\. "$\x00'):
        raise ValueError(
            f'database={database!r} is not a valid MongoDB database name: use a non-empty name without '
            '/ \\ . space " $ or NUL'
        )
    return database


def _with_codec(db: Any) -> AsyncDatabase[Document]:
    """`db` reading through `CODEC_OPTIONS` where it can be given them (`with_options`)."""
    if is_mongomock(db):
        # mongomock's `with_options` returns its synchronous database (mongomock-motor does not
        # wrap it): ask the async client the database belongs to for it by name instead.
        return cast(AsyncDatabase[Document], db.client.get_database(db.name, codec_options=CODEC_OPTIONS))
    with_options = getattr(db, 'with_options', None)
    return cast(AsyncDatabase[Document], with_options(codec_options=CODEC_OPTIONS) if callable(with_options) else db)


def _named(client: AsyncClient, name: str) -> AsyncDatabase[Document]:
    get_database = getattr(client, 'get_database', None)
    if callable(get_database):
        return cast(AsyncDatabase[Document], get_database(name, codec_options=CODEC_OPTIONS))
    return _with_codec(client[name])


def resolve_database(client: AsyncClient, database: str | None) -> AsyncDatabase[Document]:
    """`database`, else the one named in the connection string, else `DEFAULT_DATABASE`."""
    if database is not None:
        return _named(client, _check_name(database))
    get_default = getattr(client, 'get_default_database', None)
    if callable(get_default):
        db = get_default(default=DEFAULT_DATABASE, codec_options=CODEC_OPTIONS)
        if is_synchronous_mongomock(db):
            # mongomock-motor's client hands out mongomock's synchronous database here: keep
            # its name (the connection string's, else the default) and get the async one.
            return _named(client, cast(str, cast(Any, db).name))
        return cast(AsyncDatabase[Document], db)
    return _with_codec(client[DEFAULT_DATABASE])


class ClientUser:
    """The client and database a store works on, and whether closing the store closes the client.

    `MongoStepStore` and `MongoMediaStore` share this: a given `client=` is never closed by the
    store, a client the store created from `db_url=` is closed by `aclose()`.
    """

    def __init__(self, owner: str, client: object | None, db_url: str | None, database: str | None) -> None:
        self.__client, self.__owns_client = open_client(owner, client, db_url)
        self.__db = resolve_database(self.__client, database)

    @property
    def client(self) -> Any:
        """The client this store uses: the one given as `client=`, or the `AsyncMongoClient` it created."""
        return self.__client

    @property
    def database(self) -> AsyncDatabase[Document]:
        """The database this store uses, reading through `CODEC_OPTIONS`."""
        return self.__db

    @property
    def database_name(self) -> str:
        return self.__db.name

    async def aclose(self) -> None:
        """Close the client if this store created it from `db_url`; a given client stays open."""
        if self.__owns_client:
            await cast(MongoClient, self.__client).close()
