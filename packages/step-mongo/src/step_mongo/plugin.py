"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from stepcore.features import MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION
from stepcore.hookspecs import BackendInfo, hookimpl

_STEP_FEATURES = frozenset({SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT})


@hookimpl
def register_step_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='mongo',
            factory='step_mongo.store:MongoStepStore',
            features=_STEP_FEATURES,
            summary="MongoDB collections through pymongo's async client.",
        )
    ]


@hookimpl
def register_media_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='mongo',
            factory='step_mongo.media:MongoMediaStore',
            features=frozenset({PERSISTENT}),
            summary='Chunked, content-addressed blobs in MongoDB.',
        )
    ]
