"""What the pages show, read through the public `StepStore` methods only.

A page reads what it shows and little more: a run's status and event count come from its first
and latest events, a timeline page reads its own events plus `PAIRING_WINDOW` on either side (to
pair a start with its end), snapshot lists read no messages, and a snapshot page reads that
snapshot and the one before it. The store filters runs (`list_runs`); the pages are cut here.

Each page's reads have a module of their own: `runs.py` (the runs page), `recovery_panel.py` (what
a run left and the answers its pause got), `lineage.py`, `ownership_rows.py`, `job_page.py`, `timeline.py`.
This one holds what they share: the status a page shows, a run's facts, and pages of a list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from stepcore.recovery.standing import Standing
from stepcore.store.lifecycle import run_status, sort_time
from stepcore.store.models import StepEvent
from stepcore.store.step_store import StepStore

__all__ = ('Page', 'RunFacts', 'page_of', 'run_facts', 'shown_status', 'span', 'status_of')


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


def span(events: Sequence[StepEvent]) -> tuple[datetime, datetime] | None:
    if not events:
        return None
    return sort_time(events[0].timestamp), sort_time(events[-1].timestamp)
