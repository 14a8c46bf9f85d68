"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from stepcore.backend import (
    BackendInfo,
    backend_hooks,
)

register_step_stores, register_media_stores = backend_hooks(
    media=BackendInfo(
        key='disk',
        factory='media_disk.store:DiskMediaStore',
        summary='One file per blob in a local directory.',
    ),
)
