"""The records stepcore persists: runs, step events, snapshots and tool effects."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic_ai.messages import ModelMessage

__all__ = (
    'RECORD_FORMAT_VERSION',
    'ContinuableSnapshot',
    'EventKind',
    'RunRecord',
    'SnapshotMessages',
    'SnapshotState',
    'SnapshotSummary',
    'StepEvent',
    'ToolEffectRecord',
    'ToolEffectStatus',
    'utcnow',
)

RECORD_FORMAT_VERSION = 2
"""Version of the stored record format. Readers refuse records stamped with a newer version.

1: compact JSON bodies. 2: a store's bodies carry a checksum or a ciphertext (`stepcore.engine.seal`).
"""


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


class EventKind(StrEnum):
    """What happened at a step boundary."""

    RUN_STARTED = 'run_started'
    RUN_COMPLETED = 'run_completed'
    RUN_FAILED = 'run_failed'
    MODEL_REQUEST_STARTED = 'model_request_started'
    MODEL_REQUEST_COMPLETED = 'model_request_completed'
    MODEL_REQUEST_FAILED = 'model_request_failed'
    TOOL_CALL_STARTED = 'tool_call_started'
    TOOL_CALL_COMPLETED = 'tool_call_completed'
    TOOL_CALL_FAILED = 'tool_call_failed'


class SnapshotState(StrEnum):
    """Whether a snapshot's tool work was settled when it was captured."""

    COMPLETE = 'complete'
    """Every tool call has a matching result: safe to continue from."""
    INTERRUPTED = 'interrupted'
    """Tool work was unsettled (a crash or failure mid tool cycle): check the ledger first."""


class ToolEffectStatus(StrEnum):
    """Lifecycle of one tool call in the tool-effect ledger."""

    STARTED = 'started'
    COMPLETED = 'completed'
    FAILED = 'failed'


class _Record(BaseModel):
    model_config = ConfigDict(extra='ignore', validate_assignment=False, use_enum_values=False)

    store_assigned: ClassVar[frozenset[str]] = frozenset()
    """Fields the store fills in when it writes the record; `==` leaves them out."""

    def __eq__(self, other: object) -> bool:
        """Equal when every field but the store-assigned ones is equal.

        A record read back from a store equals the record that was written, although the store
        gave it a `seq` on the way.
        """
        if not isinstance(other, BaseModel):
            return NotImplemented
        if type(other) is not type(self):
            return False
        skip = self.store_assigned
        if not skip:
            return super().__eq__(other)
        mine, theirs = self.__dict__, other.__dict__
        return all(mine.get(name) == theirs.get(name) for name in type(self).model_fields if name not in skip)


class RunRecord(_Record):
    """One `Agent.run` call and its lineage."""

    run_id: str
    agent_name: str | None = None
    conversation_id: str | None = None
    parent_run_id: str | None = None
    started_at: datetime = Field(default_factory=utcnow)
    metadata: dict[str, str] = Field(default_factory=dict[str, str])
    registration_id: str | None = None
    """Identity of the registration that created this record.

    A second `register_run` with the same `run_id` and the same `registration_id` is a retry of the
    same registration (durable replay) and is accepted; any other reuse raises `ValueError`.
    """


class StepEvent(_Record):
    """An append-only record of one step boundary."""

    run_id: str
    kind: EventKind
    step_index: int = 0
    timestamp: datetime = Field(default_factory=utcnow)
    agent_name: str | None = None
    conversation_id: str | None = None
    parent_run_id: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    error: str | None = None
    """`repr`-style description of the failure, for `*_failed` events."""
    metadata: dict[str, str] = Field(default_factory=dict[str, str])
    idempotency_key: str | None = None
    """A key the store already applied for this run is suppressed; `None` always appends."""
    seq: int | None = None
    """Position in the run's event trail, assigned by the store on append (not compared by `==`)."""

    store_assigned: ClassVar[frozenset[str]] = frozenset({'seq'})


class ContinuableSnapshot(_Record):
    """The message history of a run at one boundary, loadable as `message_history=`."""

    model_config = ConfigDict(extra='ignore', arbitrary_types_allowed=True)

    run_id: str
    step_index: int = 0
    messages: list[ModelMessage] = Field(default_factory=list[ModelMessage])
    state: SnapshotState = SnapshotState.COMPLETE
    created_at: datetime = Field(default_factory=utcnow)
    agent_name: str | None = None
    conversation_id: str | None = None
    parent_run_id: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict[str, str])
    idempotency_key: str | None = None
    """A key the store already applied for this run is suppressed; `None` always saves."""
    seq: int | None = None
    """Per-run monotonic position, assigned by the store on save (not compared by `==`)."""

    store_assigned: ClassVar[frozenset[str]] = frozenset({'seq'})


class SnapshotSummary(BaseModel):
    """What a snapshot is without its messages: enough to list a run's snapshots cheaply.

    `StepStore.list_snapshot_summaries` answers these without reading any message; load one
    snapshot in full with `StepStore.get_snapshot(run_id, seq)`.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    seq: int
    state: SnapshotState
    step_index: int
    message_count: int
    """How many messages the snapshot holds."""
    created_at: datetime
    agent_name: str | None = None
    conversation_id: str | None = None
    parent_run_id: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict[str, str])
    idempotency_key: str | None = None

    @classmethod
    def of(cls, snapshot: ContinuableSnapshot, *, message_count: int | None = None) -> SnapshotSummary:
        """The summary of a stored snapshot (one read back from a store, so it has a `seq`)."""
        if snapshot.seq is None:
            raise ValueError(
                f'snapshot of run {snapshot.run_id!r} has no seq: summarize snapshots read back from a store'
            )
        return cls(
            run_id=snapshot.run_id,
            seq=snapshot.seq,
            state=SnapshotState(snapshot.state),
            step_index=snapshot.step_index,
            message_count=len(snapshot.messages) if message_count is None else message_count,
            created_at=snapshot.created_at,
            agent_name=snapshot.agent_name,
            conversation_id=snapshot.conversation_id,
            parent_run_id=snapshot.parent_run_id,
            metadata=dict(snapshot.metadata),
            idempotency_key=snapshot.idempotency_key,
        )


@dataclass(frozen=True, kw_only=True)
class SnapshotMessages:
    """Part of one stored snapshot's history: what `StepStore.get_snapshot_messages` answers.

    `messages` are the snapshot's messages from position `start` (counting from 0, oldest first)
    up to `stop`, which is at most `summary.message_count`.
    """

    summary: SnapshotSummary
    start: int
    messages: list[ModelMessage]

    @property
    def stop(self) -> int:
        return self.start + len(self.messages)


class ToolEffectRecord(_Record):
    """The ledger entry of one tool call, keyed by `(run_id, tool_call_id)`."""

    run_id: str
    tool_call_id: str
    tool_name: str
    status: ToolEffectStatus = ToolEffectStatus.STARTED
    started_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    step_index: int = 0
    idempotency_key: str | None = None
    """Set by the tool through `annotate_tool_effect`: how to deduplicate its side effect."""
    effect_summary: str | None = None
    """Set by the tool through `annotate_tool_effect`: what the side effect was, in words."""
    error: str | None = None
    args: Any = None
    """The tool call's arguments as the model sent them (JSON-compatible)."""

    @property
    def unresolved(self) -> bool:
        """True while the call has a `started` record and no terminal update."""
        return self.status is ToolEffectStatus.STARTED
