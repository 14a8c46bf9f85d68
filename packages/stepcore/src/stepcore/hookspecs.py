"""Plugin hooks: how a distribution tells stepcore which backends it provides."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pluggy

__all__ = ('PROJECT_NAME', 'BackendInfo', 'hookimpl', 'hookspec', 'register_media_stores', 'register_step_stores')

PROJECT_NAME = 'stepcore'
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@dataclass(frozen=True, kw_only=True)
class BackendInfo:
    """A lazily loaded backend: nothing is imported until it is asked for."""

    key: str
    """The name users pass as `backend=` (e.g. `'sqlite'`)."""
    factory: str
    """`"module:Class"` to import and call with the spec's options."""
    features: frozenset[str] = field(default_factory=frozenset[str])
    """Optional behaviours the backend declares (see `stepcore.features`)."""
    summary: str = ''
    """One line shown by `stepcore plugins`."""


@hookspec
def register_step_stores() -> Sequence[BackendInfo]:  # type: ignore[empty-body]
    """Return the `StepStore` backends this plugin provides."""


@hookspec
def register_media_stores() -> Sequence[BackendInfo]:  # type: ignore[empty-body]
    """Return the `MediaStore` backends this plugin provides."""
