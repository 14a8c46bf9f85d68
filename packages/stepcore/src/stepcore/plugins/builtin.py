"""stepcore's own plugin: the in-memory step store (opens from `memory://`, e.g. `memory://?max_snapshots_per_run=5`)."""

from __future__ import annotations

from stepcore.plugins.hookspecs import BackendInfo, backend_hooks

register_step_stores, register_media_stores = backend_hooks(
    step=BackendInfo(
        key='memory',
        factory='stepcore.engine.memory:InMemoryStepStore',
        summary='Process-local store, for tests and short-lived agents.',
    ),
)
