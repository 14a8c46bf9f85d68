"""The runs page: the runs a filter matches, a page at a time, each with how it stands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from stepcore.ownership.claims import has_leases
from stepcore.recovery.standing import LEASE_STATUSES, runs_by_lease, standing_of
from stepcore.store.lifecycle import RunStatus
from stepcore.store.models import RunRecord
from stepcore.store.step_store import StepStore
from stepcore.ui.queries import Page, page_of, shown_status

__all__ = ('RUNS_PER_PAGE', 'STATUSES', 'RunFilter', 'RunRow', 'RunsPage', 'runs_page')

RUNS_PER_PAGE = 50
STATUSES = tuple(dict.fromkeys(('completed', 'failed', 'unfinished', 'waiting', *LEASE_STATUSES)))


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
