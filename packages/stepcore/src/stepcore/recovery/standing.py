"""How a run stands, in one line: its status from its events, told apart by its lease.

A run whose events end unfinished may be running right now, orphaned (its owner gone), waiting for
answers to deferred tool calls, pending (recovery left calls for a person), or resumed by another
run (and then never resumed again). The CLI's `runs` and the web inspector show this, instead of
`unfinished` for all of them alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from stepcore.ownership.claims import has_leases, live
from stepcore.ownership.identity import owner_gone
from stepcore.ownership.orphans import list_orphans
from stepcore.recovery.chains import continuations
from stepcore.store.leases import Lease, LeaseState
from stepcore.store.lifecycle import RunStatus, run_status, sort_time
from stepcore.store.models import RunRecord
from stepcore.store.step_store import StepStore

__all__ = (
    'LEASE_ONLY_KEY',
    'LEASE_STATUSES',
    'Standing',
    'offers_resume',
    'record_matches',
    'runs_by_lease',
    'standing_of',
    'standings_of',
)


LEASE_STATUSES = ('running', 'orphaned', 'waiting', 'pending', 'resumed', 'dead')
"""Statuses a run's lease tells (see `Standing.ownership`), read through the store's index of lease states."""


LEASE_ONLY_KEY = 'stepcore.lease_only'
"""Metadata key of the record `runs_by_lease` stands in for a run that has a lease and no record (its
process stopped between taking its lease and registering): what is known of it."""


@dataclass(frozen=True, slots=True)
class Standing:
    """A run's status, its lease, and, when it was resumed, its newest continuation's."""

    run_id: str
    status: RunStatus
    """From the run's newest event: `completed`, `failed`, `unfinished` or `waiting`."""
    lease: Lease | None = None
    resumed_by: tuple[str, ...] = ()
    """The runs that continue it, in order (the newest last)."""
    newest_status: str | None = None
    """The newest continuation's status (or its lease's state while it has a live one)."""

    @property
    def ownership(self) -> str | None:
        """`running`, `orphaned`, `waiting`, `pending`, `resumed` or `dead`; `None` when the lease says
        nothing more."""
        lease = self.lease
        if lease is None or lease.state is LeaseState.ENDED:
            return 'resumed' if self.resumed_by else None
        if lease.state is LeaseState.RUNNING:
            return 'running' if live(lease) else 'orphaned'
        return lease.state.value

    @property
    def label(self) -> str:
        """One line for a table: the status, and what the lease adds to it."""
        lease = self.lease
        ownership = self.ownership
        if ownership == 'resumed':
            newest = self.resumed_by[-1] if self.resumed_by else (lease.resumed_by if lease is not None else '?')
            return f'resumed by {newest} ({self.newest_status or "unknown"})'
        if lease is None or ownership is None:
            return self.status
        if ownership == 'running' and lease.owner is not None:
            return f'running on {lease.owner} (lease until {lease.expires_at:%H:%M:%S})'
        if ownership == 'orphaned':
            why = 'owner gone' if owner_gone(lease) else f'lease expired {lease.expires_at:%H:%M:%S}'
            return f'orphaned ({why})'
        if ownership == 'waiting':
            return 'waiting for answers to deferred tool calls'
        if ownership == 'dead':
            newest = f'; the newest: {lease.died[-1].describe()}' if lease.died else ''
            return f'dead: {len(lease.died)} resumptions died{newest}'
        return f'pending: {lease.note}' if lease.note else 'pending: calls to settle by hand'


async def standing_of(store: StepStore, run_id: str) -> Standing:
    """How `run_id` stands (see the module docstring)."""
    status = run_status(await store.list_events_page(run_id, newest=True, limit=1))
    kept = has_leases(store)
    lease = await store.get_lease(run_id) if kept else None
    followed: list[str] = [run_id]
    if lease is None or lease.state is LeaseState.RESUMED:
        followed = await continuations(store, run_id)
    newest_status: str | None = None
    if len(followed) > 1:
        newest = followed[-1]
        newest_lease = await store.get_lease(newest) if kept else None
        if newest_lease is not None and newest_lease.state is LeaseState.RUNNING:
            newest_status = 'running' if live(newest_lease) else 'orphaned'
        elif newest_lease is not None and newest_lease.state is not LeaseState.ENDED:
            newest_status = newest_lease.state.value
        else:
            newest_status = run_status(await store.list_events_page(newest, newest=True, limit=1))
    return Standing(run_id, status, lease, tuple(followed[1:]), newest_status)


async def standings_of(store: StepStore, run_ids: Sequence[str]) -> list[Standing]:
    """`standing_of` for each run, in order."""
    return [await standing_of(store, run_id) for run_id in run_ids]


async def _lease_only(store: StepStore, run_id: str) -> RunRecord | None:
    """A stand-in record for a run with a lease and no record (`LEASE_ONLY_KEY`), started when its lease was
    taken; `None` when the lease is gone meanwhile."""
    lease = await store.get_lease(run_id)
    if lease is None:
        return None
    started = lease.since or lease.checked_at
    what = f'no run record: its process stopped after taking its lease and before registering (epoch {lease.epoch})'
    if lease.resumes is not None:
        what += f'; it resumes run {lease.resumes}'
    return RunRecord(run_id=run_id, started_at=started, metadata={LEASE_ONLY_KEY: what})


def record_matches(
    record: RunRecord,
    *,
    conversation_id: str | None = None,
    parent_run_id: str | None = None,
    agent_name: str | None = None,
    started_after: datetime | None = None,
    started_before: datetime | None = None,
) -> bool:
    """Whether `record` passes the run-list filters (those given: `None` lets everything through)."""
    started = sort_time(record.started_at)
    return (
        (conversation_id is None or record.conversation_id == conversation_id)
        and (parent_run_id is None or record.parent_run_id == parent_run_id)
        and (agent_name is None or record.agent_name == agent_name)
        and (started_after is None or started > started_after)
        and (started_before is None or started < started_before)
    )


async def runs_by_lease(
    store: StepStore,
    status: str,
    *,
    conversation_id: str | None = None,
    parent_run_id: str | None = None,
    agent_name: str | None = None,
    started_after: datetime | None = None,
    started_before: datetime | None = None,
) -> list[RunRecord]:
    """The runs whose lease says `status` (one of `LEASE_STATUSES`), newest first, through the store's
    index of lease states (never a scan of every run), with the other filters applied. A run with a
    lease and no record (stopped before it registered) is listed with a stand-in record saying so
    (`LEASE_ONLY_KEY`), unless a filter needs what only a record tells."""
    if status not in LEASE_STATUSES:
        raise ValueError(f'status {status!r} is not told by a lease: use one of {", ".join(LEASE_STATUSES)}')
    if not has_leases(store):
        raise ValueError(
            f'status {status!r} needs the store to keep leases, and {type(store).__name__} keeps none: '
            'filter by completed, failed, unfinished or waiting'
        )
    if status == 'orphaned':
        run_ids = [o.run_id for o in await list_orphans(store)]
    elif status == 'running':
        run_ids = [lease.run_id for lease in await store.list_leases([LeaseState.RUNNING]) if live(lease)]
    else:
        run_ids = [lease.run_id for lease in await store.list_leases([LeaseState(status)])]
    found: list[RunRecord] = []
    for run_id in run_ids:
        record = await store.get_run(run_id=run_id)
        if record is None:
            if conversation_id is not None or parent_run_id is not None or agent_name is not None:
                continue  # nothing tells what the run was
            record = await _lease_only(store, run_id)
            if record is None:
                continue
        if record_matches(
            record,
            conversation_id=conversation_id,
            parent_run_id=parent_run_id,
            agent_name=agent_name,
            started_after=started_after,
            started_before=started_before,
        ):
            found.append(record)
    found.sort(key=lambda r: (sort_time(r.started_at), r.run_id), reverse=True)
    return found


def offers_resume(status: str | None, lease: Lease | None, *, resumed: bool) -> bool:
    """Whether resuming is a run's next step: a crash cut it short (an orphan, a run pending a person, one
    that never ended and has no lease) or a failure ended it (`status` from its events; `None`: unknown).

    Not a run a live owner holds (its calls in flight are running), one resumed already, one that
    completed, paused (answers come first), was cancelled or ended otherwise, nor a dead one (it is
    given another chance first).
    """
    if resumed or live(lease) or status in ('completed', 'waiting'):
        return False
    if lease is None:
        return status in ('unfinished', 'failed', None)
    if lease.state is LeaseState.ENDED:
        return lease.outcome == 'failed'
    return lease.state in (LeaseState.RUNNING, LeaseState.PENDING)
