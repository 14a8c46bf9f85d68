"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from stepcore.backend import (
    BackendInfo,
    backend_hooks,
)


def postgres_url_options(url: str) -> dict[str, str]:
    """`postgresql://user@host:5432/db?sslmode=require` (or `postgres://`) -> `dsn=`, the URL as it is.

    A `table_prefix=NAME` in the query picks the store's tables (`NAME_*`) and is taken out of the DSN
    (libpq would refuse it); every other parameter stays in it for libpq.
    """
    parts = urlsplit(url.strip())
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [value for key, value in query if key == 'table_prefix']
    if not prefixes:
        return {'dsn': url.strip()}
    rest = urlencode([(key, value) for key, value in query if key != 'table_prefix'])
    return {'dsn': urlunsplit(parts._replace(query=rest)), 'table_prefix': prefixes[-1]}


register_step_stores, register_media_stores = backend_hooks(
    step=BackendInfo(
        key='postgres',
        factory='step_postgres.store:PostgresStepStore',
        schemes=('postgresql', 'postgres'),
        url_options=postgres_url_options,
        summary='Tables in a PostgreSQL database, shared by many processes (psycopg 3, pooled).',
    ),
    media=BackendInfo(
        key='postgres',
        factory='step_postgres.media:PostgresMediaStore',
        summary='Blobs in a table of a PostgreSQL database.',
    ),
)
