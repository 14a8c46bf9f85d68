"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from stepcore.features import MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION
from stepcore.hookspecs import BackendInfo, hookimpl

_STEP_FEATURES = frozenset({SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT})


@hookimpl
def register_step_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='sqlite',
            factory='step_sqlite.store:SqliteStepStore',
            features=_STEP_FEATURES,
            summary='One embedded SQLite database file (the default).',
        )
    ]


@hookimpl
def register_media_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='sqlite',
            factory='step_sqlite.media:SqliteMediaStore',
            features=frozenset({PERSISTENT}),
            summary='Blobs in a table of a SQLite database.',
        )
    ]
