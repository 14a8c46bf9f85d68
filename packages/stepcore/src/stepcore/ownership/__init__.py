"""Run ownership: one owner and one continuation per run, zombies fenced, orphans found.

- `identity`: who this process is as an owner, and whether another owner on this host is gone;
- `claims`: taking a lease (a new run, a takeover for recovery) and handing it on, each one
  compare-and-set on the store;
- `keeper`: renewing a running run's lease on a timer;
- `orphans`: the runs whose owner is gone, read through the store's index of lease states.

The records, states, errors and write fence are `stepcore.store.leases`'; the compare-and-set is the
storage engine's (`EngineStore.swap_lease`).
"""

from __future__ import annotations

from stepcore.ownership.claims import Claim, claim_run, has_leases, live, open_lease, read_lease
from stepcore.ownership.identity import host_name, new_owner, owner_gone, process_alive, same_process
from stepcore.ownership.keeper import LeaseKeeper
from stepcore.ownership.orphans import Orphan, list_orphans, list_pending

__all__ = (
    'Claim',
    'LeaseKeeper',
    'Orphan',
    'claim_run',
    'has_leases',
    'host_name',
    'list_orphans',
    'list_pending',
    'live',
    'new_owner',
    'open_lease',
    'owner_gone',
    'process_alive',
    'read_lease',
    'same_process',
)
