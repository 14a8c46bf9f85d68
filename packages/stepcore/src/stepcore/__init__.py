"""Crash-safe step persistence for pydantic-ai agents."""

from __future__ import annotations

from .hookspecs import BackendInfo, hookimpl
from .media import MediaContext, MediaStore
from .memory import InMemoryStepStore
from .models import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from .protocols import StepStore
from .registry import media_from_spec
from .registry import store_from_spec as from_spec

__all__ = (
    'BackendInfo',
    'ContinuableSnapshot',
    'EventKind',
    'InMemoryStepStore',
    'MediaContext',
    'MediaStore',
    'RunRecord',
    'SnapshotState',
    'StepEvent',
    'StepStore',
    'ToolEffectRecord',
    'ToolEffectStatus',
    'from_spec',
    'hookimpl',
    'media_from_spec',
)

__version__ = '0.1.0'
