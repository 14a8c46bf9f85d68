"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from stepcore.plugins.hookspecs import BackendInfo, hookimpl


def postgres_url_options(url: str) -> dict[str, str]:
    """`postgresql://user@host:5432/db?sslmode=require` (or `postgres://`) -> `dsn=`, the URL as it is."""
    return {'dsn': url.strip()}


@hookimpl
def register_step_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='postgres',
            factory='step_postgres.store:PostgresStepStore',
            schemes=('postgresql', 'postgres'),
            url_options=postgres_url_options,
            summary='Tables in a PostgreSQL database, shared by many processes (psycopg 3, pooled).',
        )
    ]


@hookimpl
def register_media_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='postgres',
            factory='step_postgres.media:PostgresMediaStore',
            summary='Blobs in a table of a PostgreSQL database.',
        )
    ]
