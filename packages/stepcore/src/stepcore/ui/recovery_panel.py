"""What the run page shows of a run's recovery: `inspect_recovery`'s facts without whole snapshots, its
ledger, and the answers its pause got."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from stepcore.capability.context import RESUMES_KEY
from stepcore.ownership.claims import has_leases
from stepcore.recovery.answers import Waiting, read_waiting
from stepcore.recovery.ledger import SUMMARY_MARK
from stepcore.recovery.standing import Standing, offers_resume, standing_of
from stepcore.store.models import RunRecord, SnapshotState, SnapshotSummary, ToolEffectRecord, ToolEffectStatus, utcnow
from stepcore.store.step_store import StepStore
from stepcore.store.waiting import Answer, DeferredCall
from stepcore.ui.queries import shown_status

__all__ = ('AnswerRow', 'Answers', 'RecoveryView', 'answers_of', 'answers_to', 'recovery_view', 'unresolved_first')


@dataclass(frozen=True, kw_only=True)
class RecoveryView:
    """What `inspect_recovery` reports, with snapshot summaries in place of whole snapshots.

    The page links to the snapshots rather than showing their messages, so it reads none. The
    tools that completed or failed come from the ledger (each call's latest status) rather than
    from the whole event trail.
    """

    run_id: str
    run: RunRecord | None
    newest_snapshot: SnapshotSummary | None
    settled_snapshot: SnapshotSummary | None
    unresolved_effects: list[ToolEffectRecord]
    completed_tools: tuple[str, ...]
    failed_tools: tuple[str, ...]
    settled_on_recovery: tuple[str, ...] = ()
    """Calls `resolve_run` settled from outside the snapshots (their summaries say how)."""
    standing: Standing | None = None
    """How the run stands by its lease: running, orphaned, waiting, pending or resumed."""
    start_point: bool = False
    """The store kept the run's start point: without a settled snapshot it still resumes."""
    waiting: Waiting | None = None
    """The deferred tool calls the run paused on, with their answers (a run that paused)."""
    resumes: Waiting | None = None
    """The pause of the run this one resumes, with the answers it carried on with (a resumption of a pause)."""

    @property
    def live(self) -> bool:
        """A live owner holds the run: its calls still `started` are running, not cut short."""
        return self.standing is not None and self.standing.ownership == 'running'

    @property
    def resumed(self) -> bool:
        return self.standing is not None and self.standing.ownership == 'resumed'

    @property
    def offers_resume(self) -> bool:
        """Whether resuming is its next step (see `offers_resume`)."""
        if self.standing is None:
            return False
        return offers_resume(self.standing.status, self.standing.lease, resumed=self.resumed)

    @property
    def shown_status(self) -> str | None:
        return None if self.standing is None else shown_status(self.standing)

    @property
    def interrupted(self) -> bool:
        if self.waiting is not None:
            return False  # a paused history holds open calls by design: they wait for answers
        if self.newest_snapshot is None:
            return False
        return self.settled_snapshot is None or self.newest_snapshot.seq != self.settled_snapshot.seq

    @property
    def continuable_as_is(self) -> bool:
        """A settled snapshot and no unresolved call: continuing from it runs nothing twice."""
        return self.settled_snapshot is not None and not self.unresolved_effects and not self.settled_on_recovery


def _tool_names(effects: Sequence[ToolEffectRecord], status: ToolEffectStatus) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e.tool_name for e in effects if e.status is status))


async def recovery_view(
    store: StepStore, run: RunRecord | None, run_id: str, effects: Sequence[ToolEffectRecord]
) -> RecoveryView:
    """The recovery facts of a run, given its ledger (`list_tool_effects`)."""
    summaries = await store.list_snapshot_summaries(run_id, include_interrupted=True)
    settled = next((s for s in reversed(summaries) if s.state is SnapshotState.COMPLETE), None)
    standing = await standing_of(store, run_id)
    start = settled is None and has_leases(store) and await store.lease_start(run_id) is not None
    waiting = await read_waiting(store, run_id=run_id) if standing.status == 'waiting' else None
    origin = run.metadata.get(RESUMES_KEY) if run is not None else None
    resumes = await read_waiting(store, run_id=origin) if isinstance(origin, str) else None
    deferred = {c.tool_call_id for c in waiting.calls} if waiting is not None else set[str]()
    failed = [e for e in effects if e.tool_call_id not in deferred]  # a deferral is no failure
    return RecoveryView(
        run_id=run_id,
        run=run,
        newest_snapshot=summaries[-1] if summaries else None,
        settled_snapshot=settled,
        unresolved_effects=[e for e in effects if e.unresolved],
        completed_tools=_tool_names(effects, ToolEffectStatus.COMPLETED),
        failed_tools=_tool_names(failed, ToolEffectStatus.FAILED),
        settled_on_recovery=tuple(e.tool_call_id for e in effects if _recovered(e)),
        standing=standing,
        start_point=start,
        waiting=waiting,
        resumes=resumes,
    )


@dataclass(frozen=True, kw_only=True)
class AnswerRow:
    """A deferred call and how it was answered."""

    call: DeferredCall
    answer: Answer | None
    """`None`: nobody answered it before its deadline, and no expiry is recorded yet (it is denied on resume)."""

    @property
    def decision(self) -> str:
        return 'expired' if self.answer is None else self.answer.decision

    @property
    def at(self) -> datetime | None:
        return self.call.deadline if self.answer is None else self.answer.at

    @property
    def message(self) -> str | None:
        if self.answer is None:
            return 'nobody answered before its deadline: it is denied on resume'
        return self.answer.message


@dataclass(frozen=True, kw_only=True)
class Answers:
    """The answers a pause got, for the run page: of the run itself, or of the run it resumes."""

    waiting: Waiting
    rows: list[AnswerRow]
    origin: str | None = None
    """The paused run, when it is another than the run shown (the run shown resumes it)."""

    @property
    def resumed_by(self) -> str | None:
        return self.waiting.resumed_by


def answers_of(view: RecoveryView, now: datetime | None = None) -> Answers | None:
    """The answers the run page lists: those its own pause got (answered or expired calls; every call
    once it was resumed), or those of the pause it resumes; `None` when neither is there."""
    if view.waiting is not None:
        return answers_to(view.waiting, now)
    if view.resumes is not None:
        return answers_to(view.resumes, now, origin=view.resumes.run_id)
    return None


def answers_to(waiting: Waiting, now: datetime | None = None, *, origin: str | None = None) -> Answers:
    """The answers `waiting` got: the answered calls, and those past their deadline unanswered."""
    moment = now or utcnow()
    overdue = set(waiting.overdue(moment))
    rows = [
        AnswerRow(call=call, answer=waiting.answers.get(call.tool_call_id))
        for call in waiting.calls
        if call.tool_call_id in waiting.answers or call.tool_call_id in overdue
    ]
    return Answers(waiting=waiting, rows=rows, origin=origin)


def _recovered(effect: ToolEffectRecord) -> bool:
    """Settled by `resolve_run` or by hand, other than by finding its result in a snapshot."""
    summary = effect.effect_summary or ''
    return SUMMARY_MARK in summary and not summary.endswith(f'{SUMMARY_MARK}snapshot]')


def unresolved_first(effects: Sequence[ToolEffectRecord]) -> list[ToolEffectRecord]:
    """The ledger with entries still `started` on top, each group in ledger order."""
    return [e for e in effects if e.unresolved] + [e for e in effects if not e.unresolved]
