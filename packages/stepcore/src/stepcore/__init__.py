"""Crash-safe step persistence for pydantic-ai agents."""

from __future__ import annotations

from stepcore.capability.context import check_fencing_token, fencing_token
from stepcore.capability.events import SnapshotSaved
from stepcore.capability.persistence import StepPersistence
from stepcore.capability.settled import is_provider_valid
from stepcore.capability.tool_calls import annotate_tool_effect
from stepcore.common.encryption import Encryption, EncryptionKeyError, generate_key
from stepcore.common.version import VERSION
from stepcore.engine import DamagedRecordError, EngineStore
from stepcore.engine.memory import InMemoryStepStore
from stepcore.maintenance.check import StoreCheck, check_store
from stepcore.maintenance.gc import GcReport, collect_garbage
from stepcore.media.protocol import MediaContext, MediaStore
from stepcore.ownership import Orphan, list_orphans
from stepcore.plugins.hookspecs import BackendInfo, hookimpl
from stepcore.plugins.registry import media_from_spec, open_store
from stepcore.plugins.registry import store_from_spec as from_spec
from stepcore.recovery.answers import (
    AnswerConflictError,
    RequestExpiredError,
    Waiting,
    answer_call,
    approve_call,
    deny_call,
    fail_call,
    list_waiting,
    read_waiting,
    resume_run,
)
from stepcore.recovery.by_hand import mark_checked, rerun_call, supply_result
from stepcore.recovery.cancel import cancel_run
from stepcore.recovery.continuing import continue_run, fork_run
from stepcore.recovery.dead import list_dead, retry_run
from stepcore.recovery.fleet import OrphanOutcome, recover_orphans, run_recovery_loop
from stepcore.recovery.inspection import RecoveryReport, inspect_recovery
from stepcore.recovery.jobs import JobExistsError, JobResult, job_runs, start_job
from stepcore.recovery.policies import Reconciled, RecoveryPolicy, recovery_policy
from stepcore.recovery.resolution import Resumption, RunAbandonedError, Settlement, resolve_run
from stepcore.recovery.timers import apply_deadlines, ready_to_resume
from stepcore.store.leases import (
    FencingToken,
    Lease,
    LeaseState,
    RunCancelledError,
    RunClaimedError,
    RunDeadError,
    RunFencedError,
    RunOwnedError,
)
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
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.step_store import StepStore
from stepcore.store.waiting import Answer, DeferredCall

__all__ = (
    'Answer',
    'AnswerConflictError',
    'BackendInfo',
    'ContinuableSnapshot',
    'DamagedRecordError',
    'DeferredCall',
    'Encryption',
    'EncryptionKeyError',
    'EngineStore',
    'EventKind',
    'FencingToken',
    'GcReport',
    'InMemoryStepStore',
    'JobExistsError',
    'JobResult',
    'Lease',
    'LeaseState',
    'MediaContext',
    'MediaStore',
    'Orphan',
    'OrphanOutcome',
    'Reconciled',
    'RecoveryPolicy',
    'RecoveryReport',
    'RequestExpiredError',
    'Resumption',
    'RunAbandonedError',
    'RunCancelledError',
    'RunClaimedError',
    'RunDeadError',
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
    'StoreCheck',
    'ToolEffectRecord',
    'ToolEffectStatus',
    'Waiting',
    'annotate_tool_effect',
    'answer_call',
    'apply_deadlines',
    'approve_call',
    'cancel_run',
    'check_fencing_token',
    'check_store',
    'collect_garbage',
    'continue_run',
    'deny_call',
    'fail_call',
    'fencing_token',
    'fork_run',
    'from_spec',
    'generate_key',
    'hookimpl',
    'inspect_recovery',
    'is_provider_valid',
    'job_runs',
    'list_dead',
    'list_orphans',
    'list_waiting',
    'mark_checked',
    'media_from_spec',
    'open_store',
    'read_waiting',
    'ready_to_resume',
    'recover_orphans',
    'recovery_policy',
    'rerun_call',
    'resolve_run',
    'resume_run',
    'retry_run',
    'run_recovery_loop',
    'start_job',
    'supply_result',
)

__version__ = VERSION
