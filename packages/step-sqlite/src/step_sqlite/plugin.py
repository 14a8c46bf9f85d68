"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from typing import Any

from stepcore.hookspecs import BackendInfo, hookimpl
from stepcore.urls import local_path, query_options


def sqlite_url_options(url: str) -> dict[str, Any]:
    """`sqlite:///runs.db` (relative) or `sqlite:////abs/runs.db` -> `database=`; a query adds options."""
    database = local_path(url, what='database file', example='sqlite:///runs.db', strip_slash=True)
    return {'database': database, **query_options(url)}


@hookimpl
def register_step_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='sqlite',
            factory='step_sqlite.store:SqliteStepStore',
            schemes=('sqlite',),
            url_options=sqlite_url_options,
            summary='One embedded SQLite database file (the default).',
        )
    ]


@hookimpl
def register_media_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='sqlite',
            factory='step_sqlite.media:SqliteMediaStore',
            summary='Blobs in a table of a SQLite database.',
        )
    ]
