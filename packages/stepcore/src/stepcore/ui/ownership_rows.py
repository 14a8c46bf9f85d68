"""Who held a run and how it changed hands, as its lease keeps it, with the runs it resumes and that
resume it, and the job it belongs to (its chain's first run)."""

from __future__ import annotations

from dataclasses import dataclass

from stepcore.capability.context import RESUMES_KEY
from stepcore.ownership.claims import has_leases
from stepcore.recovery.chains import continuations
from stepcore.recovery.standing import Standing
from stepcore.store.leases import HISTORY_LIMIT, Lease, OwnershipChange
from stepcore.store.models import RunRecord
from stepcore.store.step_store import StepStore

__all__ = ('CHAIN_LIMIT', 'Ownership', 'first_run_of', 'first_taker', 'is_job', 'ownership_of')

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
