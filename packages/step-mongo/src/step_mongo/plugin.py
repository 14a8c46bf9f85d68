"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from stepcore.backend import (
    BackendInfo,
    backend_hooks,
)


def mongo_url_options(url: str) -> dict[str, str]:
    """`mongodb://host:27017/mydb?authSource=admin` -> `db_url=` (without the database) and `database='mydb'`.

    The query stays in `db_url`: it holds the client's connection options.
    """
    parts = urlsplit(url.strip())
    database = parts.path.lstrip('/')
    if not database or '/' in database:
        raise ValueError(
            f'store URL {url.strip()!r} names no database: add it as the path, e.g. mongodb://localhost/runs'
        )
    db_url = urlunsplit((parts.scheme, parts.netloc, '/', parts.query, ''))
    return {'db_url': db_url, 'database': database}


register_step_stores, register_media_stores = backend_hooks(
    step=BackendInfo(
        key='mongo',
        factory='step_mongo.store:MongoStepStore',
        schemes=('mongodb', 'mongodb+srv'),
        url_options=mongo_url_options,
        summary="MongoDB collections through pymongo's async client.",
    ),
    media=BackendInfo(
        key='mongo',
        factory='step_mongo.media:MongoMediaStore',
        summary='Chunked, content-addressed blobs in MongoDB.',
    ),
)
