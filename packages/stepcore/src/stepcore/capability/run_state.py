"""`RunState`: what `StepPersistence` keeps about one run, and the records it builds for it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic_ai.messages import ModelMessage
from pydantic_ai.tools import RunContext

from stepcore.capability.content_tracker import ContentTracker
from stepcore.capability.run_writer import RunWriter
from stepcore.capability.settled import SettledTracker
from stepcore.store.ids import derive_run_id
from stepcore.store.leases import Fence
from stepcore.store.models import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
)

__all__ = ('RunState', 'describe_error', 'resolve_run_id')


def describe_error(error: BaseException) -> str:
    """How an exception is recorded in an event or ledger entry: its `repr`, as the reference records it."""
    return repr(error)


def resolve_run_id(ctx: RunContext[Any], *, run_id: str | None, agent_name: str | None) -> str:
    """The id a run's records are stored under: `run_id` as given, else derived from `agent_name` and
    `ctx.run_id`, else `ctx.run_id`."""
    if run_id is not None:
        return run_id
    context_run_id = ctx.run_id
    if not context_run_id:
        raise RuntimeError(
            'StepPersistence needs the run id the agent graph assigns to each run, but RunContext.run_id is '
            f'{context_run_id!r}: pass run_id= to StepPersistence or run the agent through Agent.run/iter'
        )
    return derive_run_id(agent_name, context_run_id) if agent_name is not None else context_run_id


@dataclass
class RunState:
    """One run of a `StepPersistence`: its identity, progress, in-flight tool calls and writer."""

    run_id: str
    parent_run_id: str | None
    agent_name: str | None
    conversation_id: str | None
    metadata: dict[str, str]
    writer: RunWriter
    step_index: int = 0
    save_seq: int = 0
    key_counts: dict[str, int] = field(default_factory=dict[str, int])
    content: ContentTracker = field(default_factory=ContentTracker)
    """The newest saved history."""
    settled: SettledTracker = field(default_factory=SettledTracker)
    live: list[ModelMessage] | None = None
    """The live history, as the last node or model hook saw it (the run-level ctx goes stale)."""
    given: list[ModelMessage] | None = None
    """The history the run was started with (`message_history=`), as `before_run` saw it."""
    progressed: bool = False
    """Whether a node after the user prompt has finished: until then the run added nothing but its prompt."""
    in_flight: dict[str, ToolEffectRecord] = field(default_factory=dict[str, ToolEffectRecord])
    """The `started` entry of each tool call being executed, as stored."""
    fence: Fence = field(init=False)
    """The lease epoch the run's writes are made under (none until it takes its lease)."""
    keeper: Any = None
    """The run's `LeaseKeeper` while it holds a lease."""
    job: str | None = None
    """The job this run starts (`stepcore.start_job`): its run id is the job id."""

    def __post_init__(self) -> None:
        self.fence = Fence(self.run_id)

    def next_key(self, base: str) -> str:
        """`base` numbered by how often the run used it: a replayed run repeats the same keys."""
        n = self.key_counts.get(base, 0) + 1
        self.key_counts[base] = n
        return f'{base}:{n}'

    def state_of(self, messages: Sequence[ModelMessage]) -> SnapshotState:
        """`complete` when every tool call in `messages` is answered, else `interrupted`."""
        return SnapshotState.COMPLETE if self.settled.is_provider_valid(messages) else SnapshotState.INTERRUPTED

    def run_record(self) -> RunRecord:
        """The run's record, before registration stamps its identity."""
        return RunRecord(
            run_id=self.run_id,
            agent_name=self.agent_name,
            conversation_id=self.conversation_id,
            parent_run_id=self.parent_run_id,
            metadata=dict(self.metadata),
        )

    def event(
        self,
        kind: EventKind,
        *,
        discriminator: str,
        tool_name: str | None = None,
        tool_call_id: str | None = None,
        error: str | None = None,
    ) -> StepEvent:
        """A new event at the current step, keyed by `kind`, `discriminator` and how often both occurred."""
        # Every field from a value of its declared type: validation is skipped (it is per event).
        return StepEvent.model_construct(
            run_id=self.run_id,
            kind=kind,
            step_index=self.step_index,
            timestamp=datetime.now(UTC),
            agent_name=self.agent_name,
            conversation_id=self.conversation_id,
            parent_run_id=self.parent_run_id,
            tool_name=tool_name,
            tool_call_id=tool_call_id,
            error=error,
            metadata=dict(self.metadata),
            idempotency_key=self.next_key(f'{kind.value}:{discriminator}'),
            seq=None,
        )

    def snapshot(self, messages: list[ModelMessage], state: SnapshotState) -> ContinuableSnapshot:
        """A new snapshot of `messages` at the current step."""
        self.save_seq += 1
        step = self.step_index
        # Built from values of known types: validating the whole history again at every save is skipped.
        return ContinuableSnapshot.model_construct(
            run_id=self.run_id,
            step_index=step,
            messages=messages,
            state=state,
            timestamp=datetime.now(UTC),
            agent_name=self.agent_name,
            conversation_id=self.conversation_id,
            parent_run_id=self.parent_run_id,
            metadata=dict(self.metadata),
            idempotency_key=f'snapshot:{self.save_seq}:{step}:{state.value}',
            seq=None,
        )
