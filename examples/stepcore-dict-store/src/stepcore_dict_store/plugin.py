"""Tells stepcore about the `dict` backend. Imported at plugin discovery, so it imports nothing heavy."""

from __future__ import annotations

from stepcore import BackendInfo, hookimpl


@hookimpl
def register_step_stores() -> list[BackendInfo]:
    return [
        BackendInfo(
            key='dict',
            factory='stepcore_dict_store.store:DictStepStore',
            summary='Runs kept in Python dicts (an example plugin).',
        )
    ]
