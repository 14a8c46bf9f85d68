"""`inspect_recovery`: what a store knows about a run, gathered for a recovery decision."""

from __future__ import annotations

from dataclasses import replace

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from stepcore.ownership.claims import has_leases, live
from stepcore.recovery.chains import continuations
from stepcore.recovery.ledger import called_in, settlements_of
from stepcore.recovery.paused import Waiting, waiting_of
from stepcore.store.contract import as_step_store
from stepcore.store.leases import Lease, LeaseState
from stepcore.store.lifecycle import run_status
from stepcore.store.models import ContinuableSnapshot, EventKind, RunRecord, StepEvent, ToolEffectRecord
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.waiting import is_answer, waits

__all__ = ('RecoveryInspection', 'RecoveryReport', 'inspect_recovery')


class RecoveryReport(BaseModel):
    """The state of one run as needed to decide how to resume it.

    It reports; it does not decide. A tool in `unresolved` may or may not have run, a tool in
    `failed_tools` may have made partial changes, and a tool in `completed_tools` may have
    returned a result that no snapshot holds: whether replaying is safe is for the caller (and the
    tool's own idempotency) to judge.

    `latest`, `settled`, `unresolved`, `completed_tools` and `failed_tools` are the fields of
    pydantic-ai-harness's report; `run_id` and `run` are stepcore's. The names stepcore 0.1 used
    (`newest_snapshot`, `settled_snapshot`, `unresolved_effects`) still read and construct.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True, populate_by_name=True)

    run_id: str
    run: RunRecord | None = None
    """The run's record, or `None` when the store never registered it."""
    latest: ContinuableSnapshot | None = Field(default=None, validation_alias=AliasChoices('latest', 'newest_snapshot'))
    """The newest snapshot of any state (may be `interrupted`)."""
    settled: ContinuableSnapshot | None = Field(
        default=None, validation_alias=AliasChoices('settled', 'settled_snapshot')
    )
    """The newest `complete` snapshot: what `continue_run` returns by default."""
    unresolved: tuple[ToolEffectRecord, ...] = Field(
        default=(), validation_alias=AliasChoices('unresolved', 'unresolved_effects')
    )
    """Ledger entries still `started`: calls cut short, or returned with their result in no complete
    snapshot (continuing from `settled` may run them again)."""
    completed_tools: tuple[str, ...] = ()
    """Names of the tools with a completed call, each once, in the order of their first completion."""
    failed_tools: tuple[str, ...] = ()
    """Names of the tools with a failed call, each once, in the order of their first failure."""
    settled_on_recovery: tuple[str, ...] = ()
    """Ids of the calls `resolve_run` (or a caller, by hand) settled whose results no complete snapshot
    of this run holds: `resolve_run` hands them over again; `continue_run` alone would not."""
    leases_kept: bool = False
    """Whether the store keeps run ownership (feature `leases`): without it nothing tells whether
    another process still runs the run, and recovery cannot check it."""
    lease: Lease | None = None
    """The run's lease, read with the store's clock (`None`: the store keeps none, or the run has none)."""
    resumed_by: tuple[str, ...] = ()
    """The runs that continue this one, in order (the newest last): recovery acts on the newest."""
    newest_status: str | None = None
    """How the newest continuation stands: `completed`, `failed`, `unfinished`, or its lease's state."""
    start_point: bool = False
    """Whether the store kept the run's start point, so a run with no settled snapshot can still be
    resumed from its first request."""
    waiting: Waiting | None = None
    """For a run that paused on deferred tool calls: the calls, the answers recorded so far, and the
    run that resumed it, if any (`stepcore.recovery.answers`)."""

    @property
    def live(self) -> bool:
        """Whether a live owner holds the run now (recovery must not act on it)."""
        return live(self.lease)

    @property
    def resumed(self) -> bool:
        """Whether another run continues this one: it is never resumed again."""
        return bool(self.resumed_by)

    @property
    def newest_snapshot(self) -> ContinuableSnapshot | None:
        """`latest`, by its stepcore 0.1 name."""
        return self.latest

    @property
    def settled_snapshot(self) -> ContinuableSnapshot | None:
        """`settled`, by its stepcore 0.1 name."""
        return self.settled

    @property
    def unresolved_effects(self) -> list[ToolEffectRecord]:
        """`unresolved` as a list, by its stepcore 0.1 name."""
        return list(self.unresolved)

    @property
    def interrupted(self) -> bool:
        """True when the newest snapshot is newer than the settled one (or there is no settled one).

        A process killed inside a tool usually leaves no newer snapshot (unless the run used
        `capture_frontier=True`): its cut-short calls show in `unresolved`, not here. Ask
        `continuable_as_is` whether continuing is safe.
        """
        if self.latest is None:
            return False
        return self.settled is None or self.latest.seq != self.settled.seq

    @property
    def continuable_as_is(self) -> bool:
        """True when `continue_run` can carry on from `settled` and nothing may run twice: there is a
        settled snapshot and no unresolved call. Otherwise settle the calls with `resolve_run` first."""
        return self.settled is not None and not self.unresolved and not self.settled_on_recovery


RecoveryInspection = RecoveryReport
"""The report's name in pydantic-ai-harness."""


def _tools(events: list[StepEvent], kind: EventKind) -> tuple[str, ...]:
    """The tools of `kind` events, each once: an answer to a deferred call is no call of the tool."""
    return tuple(dict.fromkeys(e.tool_name for e in events if e.kind is kind and e.tool_name and not is_answer(e)))


async def inspect_recovery(*, store: StepStoreProtocol, run_id: str) -> RecoveryReport:
    """Gather the run record, newest and settled snapshots, unresolved ledger entries and tool outcomes of `run_id`.

    Nothing is executed or rewritten. The tools that completed or failed come from the run's events,
    so a call id that failed and later completed counts in both.
    """
    store = as_step_store(store)
    events = await store.list_events(run_id=run_id)
    settled = await store.latest_snapshot(run_id=run_id)
    in_settled = called_in(settled.messages) if settled is not None else set()
    recovered = tuple(call for call in settlements_of(events) if call not in in_settled)
    kept = has_leases(store)
    lease = await store.get_lease(run_id) if kept else None
    followed = await continuations(store, run_id)
    newest_status: str | None = None
    if len(followed) > 1:
        newest = followed[-1]
        newest_lease = await store.get_lease(newest) if kept else None
        if newest_lease is not None and newest_lease.state is not LeaseState.ENDED:
            newest_status = newest_lease.state.value
        else:
            newest_status = run_status(await store.list_events_page(newest, newest=True, limit=1))
    start = settled is None and kept and await store.lease_start(run_id) is not None
    paused = waiting_of(run_id, events, None) if events and waits(events[-1]) else None
    if paused is not None:
        latest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
        paused = replace(paused, snapshot=latest, resumed_by=followed[1] if len(followed) > 1 else None)
    return RecoveryReport(
        run_id=run_id,
        leases_kept=kept,
        lease=lease,
        resumed_by=tuple(followed[1:]),
        newest_status=newest_status,
        start_point=start,
        run=await store.get_run(run_id=run_id),
        latest=await store.latest_snapshot(run_id=run_id, include_interrupted=True),
        settled=settled,
        settled_on_recovery=recovered,
        unresolved=tuple(await store.list_unresolved_tool_effects(run_id=run_id)),
        completed_tools=_tools(events, EventKind.TOOL_CALL_COMPLETED),
        failed_tools=_tools(events, EventKind.TOOL_CALL_FAILED),
        waiting=paused,
    )
