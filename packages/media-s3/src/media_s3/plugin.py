"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from stepcore.plugins.hookspecs import BackendInfo, hookimpl


@hookimpl
def register_media_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='s3',
            factory='media_s3.store:S3MediaStore',
            summary='Objects in an S3-compatible bucket (AWS S3, R2, MinIO).',
        )
    ]
