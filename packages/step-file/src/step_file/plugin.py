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


def file_url_options(url: str) -> dict[str, Any]:
    """`file:///abs/runs` or `file:runs` (relative) -> `directory=`; a query adds options."""
    directory = local_path(url, what='folder', example='file:///path/to/runs')
    return {'directory': directory, **query_options(url)}


def check_folder(path: Path) -> None:
    """`ValueError` unless `path` is a folder (of runs)."""
    if not path.is_dir():
        raise ValueError(f'{str(path)!r} is a file, not a folder of runs: for a SQLite database use sqlite://')


register_step_stores, register_media_stores = backend_hooks(
    step=BackendInfo(
        key='file',
        factory='step_file.store:FileStepStore',
        schemes=('file',),
        url_options=file_url_options,
        default_location={'directory': '.step-persistence'},
        check_location='step_file.plugin:check_folder',
        summary='One folder per run on the local file system.',
    ),
)
