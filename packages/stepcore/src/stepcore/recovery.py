"""`inspect_recovery`: what a store knows about a run, gathered for a recovery decision."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .models import ContinuableSnapshot, RunRecord, ToolEffectRecord, ToolEffectStatus
from .protocols import StepStore

__all__ = ('RecoveryReport', 'inspect_recovery')


class RecoveryReport(BaseModel):
    """The state of one run as needed to decide how to resume it.

    It reports; it does not decide. A tool in `unresolved_effects` may or may not have run, and a
    tool in `failed_tools` may have made partial changes: whether replaying is safe is for the
    caller (and the tool's own idempotency) to judge.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    run_id: str
    run: RunRecord | None = None
    """The run's record, or `None` when the store never registered it."""
    newest_snapshot: ContinuableSnapshot | None = None
    """The newest snapshot of any state (may be `interrupted`)."""
    settled_snapshot: ContinuableSnapshot | None = None
    """The newest `complete` snapshot: what `continue_run` returns by default."""
    unresolved_effects: list[ToolEffectRecord] = Field(default_factory=list[ToolEffectRecord])
    """Tool calls with a `started` record and no terminal update: cut short, or returned with their
    result in no complete snapshot (continuing from `settled_snapshot` may run them again)."""
    completed_tools: list[str] = Field(default_factory=list[str])
    """Names of the tools with a `completed` record, in ledger order."""
    failed_tools: list[str] = Field(default_factory=list[str])
    """Names of the tools with a `failed` record, in ledger order."""

    @property
    def interrupted(self) -> bool:
        """True when the newest snapshot is newer than the settled one (or there is no settled one)."""
        if self.newest_snapshot is None:
            return False
        return self.settled_snapshot is None or self.newest_snapshot.seq != self.settled_snapshot.seq


async def inspect_recovery(*, store: StepStore, run_id: str) -> RecoveryReport:
    """Gather the run record, newest and settled snapshots and the tool-effect ledger of `run_id`."""
    effects = await store.list_tool_effects(run_id)
    return RecoveryReport(
        run_id=run_id,
        run=await store.get_run(run_id),
        newest_snapshot=await store.latest_snapshot(run_id, include_interrupted=True),
        settled_snapshot=await store.latest_snapshot(run_id),
        unresolved_effects=[e for e in effects if e.status is ToolEffectStatus.STARTED],
        completed_tools=[e.tool_name for e in effects if e.status is ToolEffectStatus.COMPLETED],
        failed_tools=[e.tool_name for e in effects if e.status is ToolEffectStatus.FAILED],
    )
