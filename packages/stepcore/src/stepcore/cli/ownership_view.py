"""Who held a run, as the commands show it: the ownership history its lease keeps, and the runs it
resumes and is resumed by (with who runs the resumption)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from stepcore.ownership.claims import read_lease
from stepcore.store.leases import Change, Lease, OwnershipChange
from stepcore.store.step_store import StepStore

__all__ = ('Ownership', 'ownership_block', 'read_ownership')

_STYLES = {
    Change.TAKEN: 'green',
    Change.TAKEN_OVER: 'yellow',
    Change.REFUSED: 'red',
    Change.FENCED: 'yellow',
}


@dataclass(frozen=True, slots=True)
class Ownership:
    """A run's lease (`None`: the store keeps none, or the run has none) and who runs its resumption."""

    run_id: str
    lease: Lease | None
    resumed_by_owner: str | None = None
    """Who took the lease of the run that resumes this one (host, pid), when it is known."""

    @property
    def history(self) -> tuple[OwnershipChange, ...]:
        return self.lease.history if self.lease is not None else ()

    def as_json(self) -> dict[str, Any]:
        lease = self.lease
        return {
            'resumes': lease.resumes if lease is not None else None,
            'resumed_by': lease.resumed_by if lease is not None else None,
            'resumed_by_owner': self.resumed_by_owner,
            'history': [{'kind': change.kind, **change.to_json()} for change in self.history],
        }


async def read_ownership(store: StepStore, run_id: str) -> Ownership:
    """The run's lease, and who took the lease of its resumption."""
    lease = await read_lease(store, run_id)
    owner = None
    if lease is not None and lease.resumed_by is not None:
        resumption = await read_lease(store, lease.resumed_by)
        owner = resumption.taken_by if resumption is not None else None
    return Ownership(run_id, lease, owner)


def link_lines(ownership: Ownership) -> list[Text]:
    """`resumes run X` / `resumed by run Y on host pid N`, for the runs the lease names."""
    lease = ownership.lease
    lines: list[Text] = []
    if lease is None:
        return lines
    if lease.resumes is not None:
        lines.append(Text(f'resumes run {lease.resumes}  (stepcore job {lease.job or lease.origin or lease.resumes})'))
    if lease.resumed_by is not None:
        where = f' on {ownership.resumed_by_owner}' if ownership.resumed_by_owner else ''
        lines.append(Text(f'resumed by run {lease.resumed_by}{where}'))
    return lines


def ownership_block(ownership: Ownership) -> RenderableType | None:
    """The run's links and its ownership history, oldest first, one change a line; `None` when there
    is nothing to say (no lease)."""
    lease = ownership.lease
    if lease is None:
        return None
    lines = link_lines(ownership)
    lines.append(Text(f'ownership ({lease.headline()}):', style='bold'))
    if not lease.history:
        lines.append(Text('  no changes recorded (a lease stored before its history was kept)', style='dim'))
    for change in lease.history:
        line = Text('  ')
        line.append(change.at.strftime('%Y-%m-%d %H:%M:%S'), style='dim')
        line.append('  ')
        line.append(change.kind, style=_STYLES.get(change.what, ''))
        line.append(f'  {change.describe()}')
        lines.append(line)
    return Group(*lines)
