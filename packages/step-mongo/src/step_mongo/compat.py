"""Where mongomock's in-memory client differs from a MongoDB server, and how the stores adapt.

mongomock-motor's `AsyncMongoMockClient` (an in-memory client for tests, built on mongomock) is
accepted as `client=`. These of its differences break the stores' ordinary calls; each is adapted
only for a client, database or collection of mongomock (`is_mongomock`), so the calls made to a
MongoDB server stay exactly as they are:

- `create_indexes` drops each model's `partialFilterExpression`, so the partial unique indexes
  on `idempotency_key` would refuse a second document without a key. Each index is created with
  `create_index`, which keeps the option.
- `bulk_write` fails on `ReplaceOne` with pymongo 4.11 or later (mongomock's bulk builder does
  not take the `sort` argument pymongo passes). The replacements are made one `replace_one` at a
  time, in order, and a duplicate key is reported as the `BulkWriteError` a server would send.
- A database's `with_options(...)` and the client's `get_default_database(...)` hand out
  mongomock's synchronous database instead of the async one (see `client.resolve_database`).
- It has no `$$NOW` (an update pipeline sets the field to null, `$expr` fails) and no sessions,
  hence no transactions. The leases of `MongoPort` take the time from this process's clock there
  (`MongoPort._local_clock`): mongomock's data lives in this one process, so there is one clock.

mongomock runs each call to completion without yielding, so a replacement made alone is as
atomic there as one inside a bulk write on a server, and a sequence of calls with no other await
between them (a lease's read and write, a fenced write from its check to its last write) is atomic
against every other task.

Two more differences need no adapting: mongomock refuses codec options with an explicit `tzinfo`
(`client.CODEC_OPTIONS` sets only `tz_aware`, which means UTC), and it keeps a database's codec
options from the first time the database is handed out, so raw documents of a database the
application used first read dates naive; the stores' records take their times from the JSON body
and the microsecond twins, and the engine orders a naive time as UTC.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymongo import IndexModel, ReplaceOne
from pymongo.errors import BulkWriteError, DuplicateKeyError

__all__ = ('create_indexes', 'is_mongomock', 'is_synchronous_mongomock', 'replace_all')


def _packages(obj: object) -> set[str]:
    """The top-level packages `obj`'s class and its base classes come from.

    mongomock-motor's classes present themselves as Motor's (their `__class__` and `__module__`
    are Motor's); the bases they are made from are not.
    """
    return {cls.__module__.partition('.')[0] for cls in type(obj).__mro__}


def is_mongomock(obj: object) -> bool:
    """Whether `obj` (a client, database or collection) is mongomock-motor's async one."""
    return 'mongomock_motor' in _packages(obj)


def is_synchronous_mongomock(obj: object) -> bool:
    """Whether `obj` is one of mongomock's own synchronous objects (not wrapped by mongomock-motor)."""
    packages = _packages(obj)
    return 'mongomock' in packages and 'mongomock_motor' not in packages


async def create_indexes(collection: Any, models: Sequence[IndexModel]) -> None:
    """`collection.create_indexes(models)`; on mongomock one `create_index` per model, options kept."""
    if not is_mongomock(collection):
        await collection.create_indexes(list(models))
        return
    for model in models:
        document = dict(model.document)
        keys = list(document.pop('key').items())
        await collection.create_index(keys, **document)


async def replace_all(
    collection: Any, replacements: Sequence[tuple[dict[str, Any], dict[str, Any]]], *, ordered: bool, **options: Any
) -> None:
    """Replace-or-insert each `(filter, document)` in one bulk write (on mongomock: one by one).

    `options` go to the bulk write (a `session`). Raises `BulkWriteError` as the bulk write does:
    with the duplicate-key failures in `details['writeErrors']`, stopping at the first when `ordered`.
    """
    if not is_mongomock(collection):
        requests = [ReplaceOne(f, d, upsert=True) for f, d in replacements]
        await collection.bulk_write(requests, ordered=ordered, **options)
        return
    errors: list[dict[str, Any]] = []
    for index, (query, document) in enumerate(replacements):
        try:
            await collection.replace_one(query, document, upsert=True)
        except DuplicateKeyError as error:
            errors.append({'index': index, 'code': error.code, 'errmsg': str(error), 'op': document})
            if ordered:
                break
    if errors:
        raise BulkWriteError({'writeErrors': errors, 'writeConcernErrors': []})
