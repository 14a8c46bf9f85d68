"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from stepcore.features import MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION
from stepcore.hookspecs import BackendInfo, hookimpl

_STEP_FEATURES = frozenset({SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT})


@hookimpl
def register_step_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='postgres',
            factory='step_postgres.store:PostgresStepStore',
            features=_STEP_FEATURES,
            summary='Tables in a PostgreSQL database, shared by many processes (psycopg 3, pooled).',
        )
    ]


@hookimpl
def register_media_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='postgres',
            factory='step_postgres.media:PostgresMediaStore',
            features=frozenset({PERSISTENT}),
            summary='Blobs in a table of a PostgreSQL database.',
        )
    ]
