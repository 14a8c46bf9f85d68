"""Crash-safe step persistence for pydantic-ai agents."""

from __future__ import annotations

from .capability import StepPersistence
from .encryption import Encryption, EncryptionKeyError, generate_key
from .engine import DamagedRecordError, EngineStore
from .events import SnapshotSaved
from .gc import GcReport, collect_garbage
from .helpers import annotate_tool_effect, continue_run, fork_run, is_provider_valid
from .hookspecs import BackendInfo, hookimpl
from .media import MediaContext, MediaStore
from .memory import InMemoryStepStore
from .models import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotMessages,
    SnapshotState,
    SnapshotSummary,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from .policies import Reconciled, RecoveryPolicy, recovery_policy
from .protocols import StepStore, StepStoreProtocol
from .recovery import RecoveryReport, inspect_recovery
from .registry import media_from_spec, open_store
from .registry import store_from_spec as from_spec
from .resolution import Resumption, Settlement, mark_checked, resolve_run, supply_result

__all__ = (
    'BackendInfo',
    'ContinuableSnapshot',
    'DamagedRecordError',
    'Encryption',
    'EncryptionKeyError',
    'EngineStore',
    'EventKind',
    'GcReport',
    'InMemoryStepStore',
    'MediaContext',
    'MediaStore',
    'Reconciled',
    'RecoveryPolicy',
    'RecoveryReport',
    'Resumption',
    'RunRecord',
    'Settlement',
    'SnapshotMessages',
    'SnapshotSaved',
    'SnapshotState',
    'SnapshotSummary',
    'StepEvent',
    'StepPersistence',
    'StepStore',
    'StepStoreProtocol',
    'ToolEffectRecord',
    'ToolEffectStatus',
    'annotate_tool_effect',
    'collect_garbage',
    'continue_run',
    'fork_run',
    'from_spec',
    'generate_key',
    'hookimpl',
    'inspect_recovery',
    'is_provider_valid',
    'mark_checked',
    'media_from_spec',
    'open_store',
    'recovery_policy',
    'resolve_run',
    'supply_result',
)

__version__ = '0.1.0'
