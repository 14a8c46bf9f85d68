"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from stepcore.features import MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION
from stepcore.hookspecs import BackendInfo, hookimpl

_STEP_FEATURES = frozenset({SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT})


@hookimpl
def register_step_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='file',
            factory='step_file.store:FileStepStore',
            features=_STEP_FEATURES,
            summary='One folder per run on the local file system.',
        )
    ]
