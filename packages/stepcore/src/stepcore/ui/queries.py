"""What the pages show, read through the public `StepStore` methods only.

A page reads what it shows and little more: a run's status and event count come from its first
and latest events, a timeline page reads its own events plus `PAIRING_WINDOW` on either side (to
pair a start with its end), snapshot lists read no messages, and a snapshot page reads that
snapshot and the one before it. The store filters runs (`list_runs`); the pages are cut here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

from stepcore.ownership.claims import has_leases
from stepcore.recovery.answers import Waiting, read_waiting
from stepcore.recovery.chains import continuations
from stepcore.recovery.jobs import job_runs, job_status
from stepcore.recovery.resolution import RESUMES_KEY, SUMMARY_MARK
from stepcore.recovery.standing import LEASE_STATUSES, Standing, offers_resume, runs_by_lease, standing_of
from stepcore.store.leases import HISTORY_LIMIT, Lease, OwnershipChange
from stepcore.store.lifecycle import RunStatus, run_status, sort_time
from stepcore.store.models import (
    EventKind,
    RunRecord,
    SnapshotState,
    SnapshotSummary,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
    utcnow,
)
from stepcore.store.step_store import StepStore
from stepcore.store.waiting import Answer, DeferredCall, answer_of, is_answer

__all__ = (
    'ANSWERED',
    'CHAIN_LIMIT',
    'EVENTS_PER_PAGE',
    'LINEAGE_LIMIT',
    'PAIRING_WINDOW',
    'RUNS_PER_PAGE',
    'STATUSES',
    'AnswerRow',
    'Answers',
    'ChangeRow',
    'JobRunView',
    'JobView',
    'Lineage',
    'LineageNode',
    'Ownership',
    'Page',
    'RecoveryView',
    'RunFacts',
    'RunFilter',
    'RunRow',
    'TimelineRow',
    'answers_of',
    'answers_to',
    'first_run_of',
    'first_taker',
    'is_job',
    'job_view',
    'lineage',
    'merge_by_time',
    'ownership_of',
    'page_of',
    'recovery_view',
    'run_facts',
    'run_status',
    'runs_page',
    'shown_status',
    'status_of',
    'timeline',
    'timeline_page',
)

RUNS_PER_PAGE = 50
EVENTS_PER_PAGE = 100
LINEAGE_LIMIT = 200
"""Most runs shown in one lineage tree; a larger family is cut with a note."""
PAIRING_WINDOW = 200
"""Events read before and after a timeline page to pair the starts and ends that cross its edges."""
STATUSES = tuple(dict.fromkeys(('completed', 'failed', 'unfinished', 'waiting', *LEASE_STATUSES)))
ANSWERED = 'call_answered'
"""The kind the timeline shows an answer to a deferred call under (stored as `tool_call_completed`)."""


def shown_status(standing: Standing) -> str:
    """The status a page shows for a run: a pause another run resumed is `resumed`, not `waiting` any more."""
    if standing.status == 'waiting' and standing.ownership == 'resumed':
        return 'resumed'
    return standing.status


async def status_of(store: StepStore, run_id: str) -> str:
    """The run's status from its latest event: a run ends with `run_completed` or `run_failed`."""
    return run_status(await store.list_events_page(run_id, newest=True, limit=1))


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    status: str
    event_count: int
    span: tuple[datetime, datetime] | None
    """When the first and the latest event happened."""


async def run_facts(store: StepStore, run_id: str) -> RunFacts:
    """Status, event count and time span of a run, from its first and latest events only.

    An event's `seq` counts the run's events from 1, so the latest one's is the count.
    """
    latest = await store.list_events_page(run_id, newest=True, limit=1)
    if not latest:
        return RunFacts(status=run_status(latest), event_count=0, span=None)
    first = await store.list_events_page(run_id, limit=1)
    return RunFacts(
        status=run_status(latest),
        event_count=latest[0].seq or 0,
        span=span([*first, *latest]),
    )


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


@dataclass(frozen=True, kw_only=True)
class Page:
    """Where a slice sits in a longer list (pages count from 1)."""

    number: int
    size: int
    total: int

    @property
    def count(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def start(self) -> int:
        return (self.number - 1) * self.size

    @property
    def end(self) -> int:
        return min(self.total, self.start + self.size)


def page_of(number: int, size: int, total: int) -> Page:
    """A page, clamped into range so that a stale link lands on the last page rather than an empty one."""
    count = max(1, -(-total // size))
    return Page(number=min(max(1, number), count), size=size, total=total)


# -- runs ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunFilter:
    agent: str | None = None
    conversation: str | None = None
    parent: str | None = None
    status: str | None = None
    prefix: str | None = None
    """Runs whose id starts with this."""

    @property
    def active(self) -> bool:
        return any((self.agent, self.conversation, self.parent, self.status, self.prefix))


@dataclass(frozen=True, kw_only=True)
class RunRow:
    record: RunRecord
    status: str
    unresolved: int
    ownership: str | None = None
    """What the run's lease says beyond its status (see `stepcore.recovery.standing.Standing.ownership`)."""
    label: str = ''
    shown: str = ''
    """The status shown (see `shown_status`)."""

    @property
    def running(self) -> bool:
        """A live owner holds the run: its calls still `started` are running, not cut short."""
        return self.ownership == 'running'


@dataclass(frozen=True, kw_only=True)
class RunsPage:
    rows: list[RunRow]
    page: Page
    agents: list[str]
    """Every agent name in the store, for the filter's choices."""


async def runs_page(store: StepStore, where: RunFilter, number: int, size: int = RUNS_PER_PAGE) -> RunsPage:
    """One page of the runs matching `where`, newest first; the store applies every filter but the id prefix."""
    every = await store.list_runs()
    agents = sorted({r.agent_name for r in every if r.agent_name})
    if where.status in LEASE_STATUSES and (where.status != 'waiting' or has_leases(store)):
        found = await runs_by_lease(
            store,
            where.status,
            conversation_id=where.conversation or None,
            parent_run_id=where.parent or None,
            agent_name=where.agent or None,
        )
    elif where.conversation or where.parent or where.agent or where.status:
        found = await store.list_runs(
            conversation_id=where.conversation or None,
            parent_run_id=where.parent or None,
            agent_name=where.agent or None,
            status=cast(RunStatus | None, where.status or None),
            newest_first=True,
        )
    else:
        found = every[::-1]
    if where.prefix:
        found = [r for r in found if r.run_id.startswith(where.prefix)]
    page = page_of(number, size, len(found))
    rows: list[RunRow] = []
    for record in found[page.start : page.end]:
        standing = await standing_of(store, record.run_id)
        unresolved = len(await store.list_unresolved_tool_effects(run_id=record.run_id))
        rows.append(
            RunRow(
                record=record,
                status=standing.status,
                unresolved=unresolved,
                ownership=standing.ownership,
                label=standing.label,
                shown=shown_status(standing),
            )
        )
    return RunsPage(rows=rows, page=page, agents=agents)


# -- lineage ------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class LineageNode:
    record: RunRecord
    status: str
    """The status shown (see `shown_status`)."""
    unresolved: int
    current: bool = False
    running: bool = False
    """A live owner holds the run: its calls still `started` are running, not cut short."""
    children: list[LineageNode] = field(default_factory=list['LineageNode'])


@dataclass(kw_only=True)
class Lineage:
    ancestors: list[RunRecord]
    """The parent, its parent, and so on (nearest first)."""
    tree: LineageNode
    """The delegation tree from the topmost ancestor, with the run marked `current`."""
    siblings: list[RunRecord]
    """The runs of the same conversation, oldest first (the run itself included)."""
    cut: bool = False
    """True when the tree had more than `LINEAGE_LIMIT` runs and was cut."""
    missing_parent: str | None = None
    """A parent run id the store does not have (deleted, or never registered)."""


async def lineage(
    store: StepStore, record: RunRecord, status: str, unresolved: int, *, running: bool = False
) -> Lineage:
    """The run's ancestors, its delegation tree and its conversation; `status`, `unresolved` and `running`
    are the run's own (its page read them already)."""
    ancestors: list[RunRecord] = []
    seen = {record.run_id}
    missing: str | None = None
    parent_id = record.parent_run_id
    while parent_id and parent_id not in seen and len(ancestors) < LINEAGE_LIMIT:
        parent = await store.get_run(run_id=parent_id)
        if parent is None:
            missing = parent_id
            break
        ancestors.append(parent)
        seen.add(parent_id)
        parent_id = parent.parent_run_id
    top = ancestors[-1] if ancestors else record
    budget = [LINEAGE_LIMIT]

    async def node(run: RunRecord, visited: set[str]) -> LineageNode:
        budget[0] -= 1
        if run.run_id == record.run_id:
            made = LineageNode(record=run, status=status, unresolved=unresolved, current=True, running=running)
        else:
            standing = await standing_of(store, run.run_id)
            made = LineageNode(
                record=run,
                status=shown_status(standing),
                unresolved=len(await store.list_unresolved_tool_effects(run_id=run.run_id)),
                running=standing.ownership == 'running',
            )
        visited.add(run.run_id)
        for child in await store.list_runs(parent_run_id=run.run_id):
            if child.run_id in visited or budget[0] <= 0:
                continue
            made.children.append(await node(child, visited))
        return made

    tree = await node(top, set())
    siblings = await store.list_runs(conversation_id=record.conversation_id) if record.conversation_id else [record]
    return Lineage(ancestors=ancestors, tree=tree, siblings=siblings, cut=budget[0] <= 0, missing_parent=missing)


# -- ownership ----------------------------------------------------------------------------------

CHAIN_LIMIT = 1000
"""Most runs followed back from a resumption to the first run of its chain, on a store without leases."""


@dataclass(frozen=True, kw_only=True)
class Ownership:
    """Who held a run and how it changed hands, as its lease keeps it (see docs/fleet.md, "Who held a run"),
    with the runs it resumes and that resume it, and the job it belongs to."""

    kept: bool
    """Whether the store keeps leases at all."""
    lease: Lease | None
    resumes: str | None = None
    """The run this one continues."""
    resumed_by: str | None = None
    """The run that continues this one."""
    resumed_on: str | None = None
    """Who took the first lease of `resumed_by` (host, pid): where the run went on."""
    job: str | None = None
    """The job the run belongs to (its chain's first run), when the chain has more than one run or
    `start_job` started it."""
    job_size: int = 0
    """How many runs the job has."""

    @property
    def changes(self) -> tuple[OwnershipChange, ...]:
        """The lease's changes, oldest first."""
        return self.lease.history if self.lease is not None else ()

    @property
    def cut(self) -> bool:
        """Whether changes between the first and the newest kept may have been dropped (`HISTORY_LIMIT`)."""
        return len(self.changes) >= HISTORY_LIMIT


def first_taker(lease: Lease | None) -> str | None:
    """Who took the lease first (host, pid), as its history says; else its current owner."""
    return lease.taken_by if lease is not None else None


def _resumes_of(record: RunRecord | None) -> str | None:
    origin = record.metadata.get(RESUMES_KEY) if record is not None else None
    return origin if isinstance(origin, str) else None


async def first_run_of(store: StepStore, run_id: str) -> str | None:
    """The first run of the chain `run_id` belongs to (its job's id): from its lease (`job`, `origin`),
    or back through the records of the runs it resumes on a store without leases; `None` when the
    store knows no such run."""
    if has_leases(store):
        lease = await store.get_lease(run_id)
        if lease is not None:
            return lease.job or lease.origin or run_id
    record = await store.get_run(run_id=run_id)
    if record is None:
        return None
    seen = {run_id}
    while (back := _resumes_of(record)) is not None and back not in seen and len(seen) < CHAIN_LIMIT:
        record = await store.get_run(run_id=back)
        if record is None:
            return back  # deleted: the chain starts there all the same
        seen.add(back)
    return record.run_id


async def is_job(store: StepStore, run_id: str) -> bool:
    """Whether `run_id` names a job: the first run of a chain other runs continue, or a run `start_job`
    started."""
    lease = await store.get_lease(run_id) if has_leases(store) else None
    if lease is not None:
        if lease.resumes is not None:
            return False
        if lease.job == run_id:
            return True
    else:
        record = await store.get_run(run_id=run_id)
        if record is None or _resumes_of(record) is not None:
            return False
    return len(await continuations(store, run_id)) > 1


async def ownership_of(store: StepStore, record: RunRecord, standing: Standing | None) -> Ownership:
    """The run's ownership history and the runs around it, for its page (`standing` was read already)."""
    kept = has_leases(store)
    lease = standing.lease if standing is not None else None
    resumes = (lease.resumes if lease is not None else None) or _resumes_of(record)
    following = lease.resumed_by if lease is not None else None
    if following is None and standing is not None and standing.resumed_by:
        following = standing.resumed_by[0]
    resumed_on = first_taker(await store.get_lease(following)) if following is not None and kept else None
    job: str | None = None
    size = 0
    if lease is not None or resumes is not None or following is not None:
        first = await first_run_of(store, record.run_id)
        if first is not None:
            size = len(await continuations(store, first))
            if size > 1 or (lease is not None and lease.job is not None):
                job = first
    return Ownership(
        kept=kept,
        lease=lease,
        resumes=resumes,
        resumed_by=following,
        resumed_on=resumed_on,
        job=job,
        job_size=size,
    )


@dataclass(frozen=True, kw_only=True)
class JobRunView:
    """One run of a job, for the job page."""

    run_id: str
    record: RunRecord | None
    """`None`: the run has a lease and no record (its process stopped before registering it)."""
    standing: Standing
    ownership: Ownership
    answers: Answers | None = None
    """The answers its pause got, when it paused on deferred tool calls."""

    @property
    def lease(self) -> Lease | None:
        return self.standing.lease

    @property
    def shown(self) -> str:
        """The status shown (see `shown_status`)."""
        return shown_status(self.standing)


@dataclass(frozen=True, kw_only=True)
class JobView:
    """A job: its runs, oldest first, and how it stands (its newest run's standing)."""

    job_id: str
    status: str
    runs: list[JobRunView]
    kept: bool


async def job_view(store: StepStore, job_id: str, now: datetime | None = None) -> JobView:
    """The job `job_id` for its page; `LookupError` when the store has no such job."""
    try:
        found = await job_runs(store, job_id)
    except LookupError:
        raise LookupError(
            f"the store has no job {job_id!r}: a job's id is the id of its first run; find it on the runs page"
        ) from None
    moment = now or utcnow()
    views: list[JobRunView] = []
    for run in found:
        record = await store.get_run(run_id=run.run_id)
        standing = await standing_of(store, run.run_id)
        stand_in = record or RunRecord(run_id=run.run_id)
        waiting = await read_waiting(store, run_id=run.run_id)
        views.append(
            JobRunView(
                run_id=run.run_id,
                record=record,
                standing=standing,
                ownership=await ownership_of(store, stand_in, standing),
                answers=answers_to(waiting, moment) if waiting is not None else None,
            )
        )
    return JobView(job_id=job_id, status=job_status(found), runs=views, kept=has_leases(store))


# -- timeline -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TimelineRow:
    event: StepEvent
    offset: timedelta | None
    """Time since the run's first event."""
    duration: timedelta | None = None
    """On an event that ends something (a model request, a tool call, the run): how long it took."""
    ends_seq: int | None = None
    """The seq of the event it ends."""
    open: bool = False
    """A start that nothing ended: still going, or cut short by a crash."""
    answer: Answer | None = None
    """On an answer to a deferred call (stored as `tool_call_completed`): the answer."""

    @property
    def kind(self) -> str:
        """The event's kind as the timeline shows it: an answer is `call_answered`, not a tool call's end."""
        return ANSWERED if self.answer is not None else self.event.kind.value

    @property
    def is_change(self) -> bool:
        """A step event, not a change of the run's ownership."""
        return False


@dataclass(frozen=True, kw_only=True)
class ChangeRow:
    """A change of the run's ownership, shown among its events by time."""

    change: OwnershipChange
    index: int
    """Its place in the lease's history (from 1)."""
    offset: timedelta | None
    """Time since the run's first event (negative for a lease taken before it)."""

    @property
    def kind(self) -> str:
        """`lease_taken`, `lease_taken_over`, `write_refused`, ... (see `OwnershipChange.kind`)."""
        return self.change.kind

    @property
    def is_change(self) -> bool:
        return True


_ENDS = {
    EventKind.MODEL_REQUEST_COMPLETED: EventKind.MODEL_REQUEST_STARTED,
    EventKind.MODEL_REQUEST_FAILED: EventKind.MODEL_REQUEST_STARTED,
    EventKind.TOOL_CALL_COMPLETED: EventKind.TOOL_CALL_STARTED,
    EventKind.TOOL_CALL_FAILED: EventKind.TOOL_CALL_STARTED,
    EventKind.RUN_COMPLETED: EventKind.RUN_STARTED,
    EventKind.RUN_FAILED: EventKind.RUN_STARTED,
}


_STARTS = frozenset(_ENDS.values())


def timeline(events: Sequence[StepEvent], start: int = 0, end: int | None = None) -> list[TimelineRow]:
    """Rows for `events[start:end]`: each event's offset from the first, and on an end the time since its start.

    Ends are paired with their starts over all of `events` (a start may sit on an earlier page), in
    one pass that only compares kinds and tool call ids; times are computed for the slice only.
    """
    if not events:
        return []
    end = len(events) if end is None else end
    waiting: dict[object, int] = {}
    start_of: dict[int, int] = {}
    closed: set[int] = set()
    for index, event in enumerate(events):
        kind = event.kind
        if kind in _STARTS:
            waiting[(kind, event.tool_call_id) if kind is EventKind.TOOL_CALL_STARTED else kind] = index
            continue
        opener = _ENDS.get(kind)
        if opener is None or is_answer(event):  # an answer ends no call of the tool
            continue
        key = (opener, event.tool_call_id) if opener is EventKind.TOOL_CALL_STARTED else opener
        begin = waiting.pop(key, None)
        if begin is not None:
            closed.add(begin)
            if start <= index < end:
                start_of[index] = begin
    first = sort_time(events[0].timestamp)
    rows: list[TimelineRow] = []
    for index in range(start, min(end, len(events))):
        event = events[index]
        moment = sort_time(event.timestamp)
        begin = start_of.get(index)
        rows.append(
            TimelineRow(
                event=event,
                offset=moment - first,
                duration=None if begin is None else moment - sort_time(events[begin].timestamp),
                ends_seq=None if begin is None else events[begin].seq,
                open=event.kind in _STARTS and index not in closed,
                answer=answer_of(event),
            )
        )
    return rows


async def timeline_page(
    store: StepStore,
    run_id: str,
    number: int,
    size: int = EVENTS_PER_PAGE,
    changes: Sequence[OwnershipChange] = (),
) -> tuple[list[TimelineRow | ChangeRow], Page, RunFacts]:
    """Page `number` of the run's timeline: its rows, where it sits, and the run's facts.

    The ownership `changes` (its lease's history) are merged into the events by time: a page shows
    those from its first event up to the next page's first (the first page also those before the
    run's first event, the last those after its last)."""
    facts = await run_facts(store, run_id)
    page = page_of(number, size, facts.event_count)
    if not facts.event_count:
        return [ChangeRow(change=c, index=i, offset=None) for i, c in enumerate(changes, 1)], page, facts
    # Page n holds the events with seq in ((n - 1) * size, n * size]; read a margin on either side.
    after = max(0, page.start - PAIRING_WINDOW)
    window = await store.list_events_page(run_id, after_seq=after, limit=page.end - after + PAIRING_WINDOW)
    if after > 0:
        window = [*await store.list_events_page(run_id, limit=1), *window]  # the origin of the offsets
    start = next((i for i, e in enumerate(window) if (e.seq or 0) > page.start), len(window))
    end = next((i for i, e in enumerate(window) if (e.seq or 0) > page.end), len(window))
    rows = timeline(window, start, end)
    first = sort_time(window[0].timestamp)
    low = sort_time(window[start].timestamp) if page.number > 1 and start < len(window) else None
    high = sort_time(window[end].timestamp) if end < len(window) else None
    shown = [
        ChangeRow(change=c, index=i, offset=sort_time(c.at) - first)
        for i, c in enumerate(changes, 1)
        if (low is None or sort_time(c.at) >= low) and (high is None or sort_time(c.at) < high)
    ]
    return merge_by_time(rows, shown), page, facts


def merge_by_time(rows: Sequence[TimelineRow], changes: Sequence[ChangeRow]) -> list[TimelineRow | ChangeRow]:
    """The event rows in their order, each change before the first event that happened after it."""
    merged: list[TimelineRow | ChangeRow] = []
    waiting = sorted(changes, key=lambda r: (sort_time(r.change.at), r.index))
    for row in rows:
        moment = sort_time(row.event.timestamp)
        while waiting and sort_time(waiting[0].change.at) < moment:
            merged.append(waiting.pop(0))
        merged.append(row)
    return [*merged, *waiting]


def unresolved_first(effects: Sequence[ToolEffectRecord]) -> list[ToolEffectRecord]:
    """The ledger with entries still `started` on top, each group in ledger order."""
    return [e for e in effects if e.unresolved] + [e for e in effects if not e.unresolved]


def span(events: Sequence[StepEvent]) -> tuple[datetime, datetime] | None:
    if not events:
        return None
    return sort_time(events[0].timestamp), sort_time(events[-1].timestamp)
