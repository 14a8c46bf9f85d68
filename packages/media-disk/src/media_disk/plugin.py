"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from stepcore.plugins.hookspecs import BackendInfo, hookimpl


@hookimpl
def register_media_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='disk',
            factory='media_disk.store:DiskMediaStore',
            summary='One file per blob in a local directory.',
        )
    ]
