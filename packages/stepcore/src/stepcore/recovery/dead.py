"""Runs recovery gave up on: a run whose resumptions kept dying is set `dead`, and a person retries it.

A tool that kills its worker every time (out of memory, a crashing native library) would otherwise be
resumed forever, taking a worker down each time. Each resumption of a run that died is kept in the
lease of its chain (`Lease.died`: the run, its owner, its epoch, and whether its process was gone or
its lease expired); the recovery loop (`max_recovery_attempts`) sets a run `dead` once that many died,
and resumes it no more. `list_dead` lists them; `retry_run` (`stepcore recover RUN --retry`) forgets
the deaths and makes the run an orphan again, for the loop to resume once more.
"""

from __future__ import annotations

from dataclasses import replace

from stepcore.ownership.claims import claim_run, has_leases
from stepcore.recovery.chains import continuations
from stepcore.store.contract import as_step_store
from stepcore.store.leases import DEFAULT_LEASE_TTL, Lease, LeaseState
from stepcore.store.protocols import StepStoreProtocol

__all__ = ('list_dead', 'retry_run')


async def list_dead(store: StepStoreProtocol) -> list[Lease]:
    """The runs recovery set `dead`, by run id (through the store's index of lease states); `[]` on a
    store without leases."""
    bound = as_step_store(store)
    if not has_leases(bound):
        return []
    return sorted(await bound.list_leases([LeaseState.DEAD]), key=lambda lease: lease.run_id)


async def retry_run(store: StepStoreProtocol, *, run_id: str) -> Lease:
    """Give a `dead` run (or the dead newest continuation of `run_id`) another chance: its deaths are
    forgotten and it is an orphan again at once, for the recovery loop to resume. Returns its lease.

    Raises `ValueError` for a run that is not dead (its lease says how it stands) or a store without
    leases, `LookupError` for a run the store does not know.
    """
    bound = as_step_store(store)
    if not has_leases(bound):
        raise ValueError(f'{type(bound).__name__} keeps no leases, so no run of it is ever dead: nothing to retry')
    target = (await continuations(bound, run_id))[-1]
    lease = await bound.get_lease(target)
    if lease is None:
        if await bound.get_run(run_id=target) is None:
            raise LookupError(f'cannot retry run {target!r}: the store has no such run')
        raise ValueError(f'cannot retry run {target!r}: it has no lease, so recovery never gave up on it')
    if lease.state is not LeaseState.DEAD:
        raise ValueError(f'cannot retry run {target!r}: it is not dead but {lease.describe()}; nothing to retry')
    claim = await claim_run(bound, target, ttl=DEFAULT_LEASE_TTL, action='retried')
    claim.lease = replace(claim.lease, died=())
    return await claim.release(detail='retried: its deaths forgotten, claimable at once')
