"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from stepcore.backend import (
    BackendInfo,
    backend_hooks,
)

register_step_stores, register_media_stores = backend_hooks(
    media=BackendInfo(
        key='s3',
        factory='media_s3.store:S3MediaStore',
        summary='Objects in an S3-compatible bucket (AWS S3, R2, MinIO).',
    ),
)
