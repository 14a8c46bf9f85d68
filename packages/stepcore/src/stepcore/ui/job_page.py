"""The job page: a job's runs, oldest first, each with how it stands, who held it and the answers its
pause got."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from stepcore.ownership.claims import has_leases
from stepcore.recovery.answers import read_waiting
from stepcore.recovery.jobs import job_runs, job_status
from stepcore.recovery.standing import Standing, standing_of
from stepcore.store.leases import Lease
from stepcore.store.models import RunRecord, utcnow
from stepcore.store.step_store import StepStore
from stepcore.ui.ownership_rows import Ownership, ownership_of
from stepcore.ui.queries import shown_status
from stepcore.ui.recovery_panel import Answers, answers_to

__all__ = ('JobRunView', 'JobView', 'job_view')


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
