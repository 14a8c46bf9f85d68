"""Index creation with errors that say what to fix."""

from __future__ import annotations

from collections.abc import Sequence

from pymongo import IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import OperationFailure

from .client import Document
from .compat import create_indexes

__all__ = ('ensure_indexes', 'index_error')

_UNAUTHORIZED = 13
_DUPLICATE_KEY = 11000
_DUPLICATE_KEY_CODES = frozenset({_DUPLICATE_KEY, 11001})


def index_error(collection: str, models: Sequence[IndexModel], error: OperationFailure) -> Exception:
    """Turn a failed `createIndexes` into an error naming the cause and the fix."""
    names = ', '.join(str(m.document.get('name')) for m in models)
    if error.code == _UNAUTHORIZED:
        return PermissionError(
            f'creating indexes ({names}) on MongoDB collection {collection!r} was refused: the connecting user '
            'lacks the createIndex privilege. Grant it (for example the readWrite role on this database) or '
            f'have an administrator create these indexes once. Server said: {error}'
        )
    if error.code in _DUPLICATE_KEY_CODES:
        return RuntimeError(
            f'cannot build the unique index ({names}) on MongoDB collection {collection!r}: the collection already '
            'holds documents with duplicate keys for it. Remove the duplicates (keep one document per key) and '
            f'retry. Server said: {error}'
        )
    return RuntimeError(f'creating indexes ({names}) on MongoDB collection {collection!r} failed: {error}')


async def ensure_indexes(collection: AsyncCollection[Document], models: Sequence[IndexModel]) -> None:
    """Create `models` on `collection` (a no-op for indexes that already exist)."""
    try:
        await create_indexes(collection, models)
    except OperationFailure as error:
        raise index_error(collection.full_name, models, error) from error
