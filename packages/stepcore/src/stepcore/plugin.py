"""stepcore's own plugin: the in-memory step store."""

from __future__ import annotations

from .features import SNAPSHOT_RETENTION
from .hookspecs import BackendInfo, hookimpl


@hookimpl
def register_step_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='memory',
            factory='stepcore.memory:InMemoryStepStore',
            features=frozenset({SNAPSHOT_RETENTION}),
            summary='Process-local store, for tests and short-lived agents.',
        )
    ]
