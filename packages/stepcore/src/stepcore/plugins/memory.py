"""stepcore's own plugin: the in-memory step store (opens from `memory://`, e.g. `memory://?max_snapshots_per_run=5`)."""

from __future__ import annotations

from stepcore.plugins.hookspecs import BackendInfo, hookimpl


@hookimpl
def register_step_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='memory',
            factory='stepcore.store.memory:InMemoryStepStore',
            summary='Process-local store, for tests and short-lived agents.',
        )
    ]
