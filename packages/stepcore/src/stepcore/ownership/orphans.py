"""Finding the runs nobody owns any more: read through the store's index of lease states.

An orphan is a run whose lease is `running` and whose owner is gone: the lease expired on the
store's clock, or its owner ran on this host and its process has exited. A run this very process
is still running and renewing is not one, even when a late renewal let its lease expire. Runs
waiting for an approval (`waiting`) or for a person's answer after recovery (`pending`) are never
orphans; the second kind is listed apart, so a fleet can report them without holding other runs
back.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepcore.ownership.claims import has_leases
from stepcore.ownership.identity import owner_gone
from stepcore.ownership.keeper import kept_here
from stepcore.store.contract import as_step_store
from stepcore.store.leases import Lease, LeaseState

__all__ = ('Orphan', 'list_orphans', 'list_pending')


@dataclass(frozen=True, slots=True)
class Orphan:
    """A run nobody owns: its lease, and why it counts as an orphan."""

    lease: Lease
    why: str
    """`'lease expired'` or `'owner gone'` (the owner's process exited on this host)."""

    @property
    def run_id(self) -> str:
        return self.lease.run_id


async def list_orphans(store: object) -> list[Orphan]:
    """The orphaned runs of a store that keeps leases, the longest expired first; `[]` on a store
    without leases (nothing tells there who owns a run)."""
    bound = as_step_store(store)
    if not has_leases(bound):
        return []
    found: list[Orphan] = []
    for lease in await bound.list_leases([LeaseState.RUNNING]):
        if kept_here(lease):
            continue
        if owner_gone(lease):
            found.append(Orphan(lease, 'owner gone'))
        elif lease.expired:
            found.append(Orphan(lease, 'lease expired'))
    found.sort(key=lambda o: (o.lease.expires_at, o.lease.run_id))
    return found


async def list_pending(store: object) -> list[Lease]:
    """Runs recovery left for a person (`pending`): calls under `'ask'` to settle by hand."""
    bound = as_step_store(store)
    if not has_leases(bound):
        return []
    return sorted(await bound.list_leases([LeaseState.PENDING]), key=lambda lease: lease.run_id)
