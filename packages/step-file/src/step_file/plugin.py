"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from typing import Any

from stepcore.hookspecs import BackendInfo, hookimpl
from stepcore.urls import local_path, query_options


def file_url_options(url: str) -> dict[str, Any]:
    """`file:///abs/runs` or `file:runs` (relative) -> `directory=`; a query adds options."""
    directory = local_path(url, what='folder', example='file:///path/to/runs')
    return {'directory': directory, **query_options(url)}


@hookimpl
def register_step_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='file',
            factory='step_file.store:FileStepStore',
            schemes=('file',),
            url_options=file_url_options,
            summary='One folder per run on the local file system.',
        )
    ]
