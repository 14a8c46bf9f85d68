"""Crash-safe step persistence for pydantic-ai agents."""

from __future__ import annotations

from stepcore.capability import StepPersistence
from stepcore.capability.context import fencing_token
from stepcore.capability.events import SnapshotSaved
from stepcore.engine import DamagedRecordError, EngineStore
from stepcore.engine.encryption import Encryption, EncryptionKeyError, generate_key
from stepcore.maintenance.gc import GcReport, collect_garbage
from stepcore.media import MediaContext, MediaStore
from stepcore.ownership import Orphan, list_orphans
from stepcore.plugins.hookspecs import BackendInfo, hookimpl
from stepcore.plugins.registry import media_from_spec, open_store
from stepcore.plugins.registry import store_from_spec as from_spec
from stepcore.recovery import RecoveryReport, inspect_recovery
from stepcore.recovery.fleet import OrphanOutcome, recover_orphans, run_recovery_loop
from stepcore.recovery.history import annotate_tool_effect, continue_run, fork_run, is_provider_valid
from stepcore.recovery.policies import Reconciled, RecoveryPolicy, recovery_policy
from stepcore.recovery.resolution import (
    Resumption,
    Settlement,
    mark_checked,
    rerun_call,
    resolve_run,
    supply_result,
)
from stepcore.store.leases import (
    FencingToken,
    Lease,
    LeaseState,
    RunClaimedError,
    RunFencedError,
    RunOwnedError,
)
from stepcore.store.memory import InMemoryStepStore
from stepcore.store.models import (
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
from stepcore.store.protocols import StepStore, StepStoreProtocol

__all__ = (
    'BackendInfo',
    'ContinuableSnapshot',
    'DamagedRecordError',
    'Encryption',
    'EncryptionKeyError',
    'EngineStore',
    'EventKind',
    'FencingToken',
    'GcReport',
    'InMemoryStepStore',
    'Lease',
    'LeaseState',
    'MediaContext',
    'MediaStore',
    'Orphan',
    'OrphanOutcome',
    'Reconciled',
    'RecoveryPolicy',
    'RecoveryReport',
    'Resumption',
    'RunClaimedError',
    'RunFencedError',
    'RunOwnedError',
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
    'fencing_token',
    'fork_run',
    'from_spec',
    'generate_key',
    'hookimpl',
    'inspect_recovery',
    'is_provider_valid',
    'list_orphans',
    'mark_checked',
    'media_from_spec',
    'open_store',
    'recover_orphans',
    'recovery_policy',
    'rerun_call',
    'resolve_run',
    'run_recovery_loop',
    'supply_result',
)

__version__ = '0.1.0'
