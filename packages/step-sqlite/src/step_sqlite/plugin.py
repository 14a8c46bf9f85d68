"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stepcore.backend import (
    BackendInfo,
    backend_hooks,
    local_path,
    query_options,
)


def sqlite_url_options(url: str) -> dict[str, Any]:
    """`sqlite:///runs.db` (relative) or `sqlite:////abs/runs.db` -> `database=`; a query adds options."""
    database = local_path(url, what='database file', example='sqlite:///runs.db', strip_slash=True)
    return {'database': database, **query_options(url)}


def check_database_file(path: Path) -> None:
    """`ValueError` unless `path` is a SQLite database file (an empty file is one not yet written)."""
    if path.is_dir():
        raise ValueError(f'{str(path)!r} is a folder, not a SQLite database file: for a folder of runs use file://')
    try:
        with path.open('rb') as f:
            header = f.read(16)
    except OSError as exc:
        raise ValueError(f'cannot read database {str(path)!r}: {exc.strerror or exc}') from None
    if header and header != b'SQLite format 3\x00':
        raise ValueError(f'{str(path)!r} is not a SQLite database: point --store at a database written by stepcore')


register_step_stores, register_media_stores = backend_hooks(
    step=BackendInfo(
        key='sqlite',
        factory='step_sqlite.store:SqliteStepStore',
        schemes=('sqlite',),
        url_options=sqlite_url_options,
        default_location={'database': '.step-persistence.db'},
        location_options=('connection',),
        check_location='step_sqlite.plugin:check_database_file',
        summary='One embedded SQLite database file (the default).',
    ),
    media=BackendInfo(
        key='sqlite',
        factory='step_sqlite.media:SqliteMediaStore',
        summary='Blobs in a table of a SQLite database.',
    ),
)
