"""Cancelling a run: an operator stops it wherever it stands, and nothing resumes it afterwards.

`cancel_run` follows the run to its newest continuation and takes it over in one compare-and-set on
its lease, live owner or not, which raises the epoch: the owner's next write is refused by the store
(`RunFencedError`, naming the cancel), and a tool in flight that checks its fencing token downstream
is refused there as soon as anyone presents the newer epoch (`check_fencing_token` asks the store
directly). Under that claim it appends the run's `run_failed` event, saying who cancelled it and why,
then ends the lease as `cancelled`. A cancelled run is never an orphan, and recovery, answers and
resumes refuse it (`RunCancelledError`).

An orphan, a run paused on deferred calls and a run left pending for a person end at once. Only a
store that keeps leases can cancel: elsewhere nothing would stop the run's owner.
"""

from __future__ import annotations

import os
import socket

from stepcore.capability.context import settling_under
from stepcore.common.telemetry import cancelling
from stepcore.ownership.claims import claim_run, has_leases
from stepcore.recovery.chains import continuations
from stepcore.recovery.ledger import run_end_event
from stepcore.store.contract import as_step_store, write_records
from stepcore.store.leases import CANCELLED, DEFAULT_LEASE_TTL, Fence, Lease, LeaseState, RunClaimedError
from stepcore.store.models import EventKind, StepEvent
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.step_store import StepStore

__all__ = ('CANCELLED_BY_KEY', 'CANCEL_REASON_KEY', 'cancel_run')

CANCELLED_BY_KEY = 'stepcore.cancelled_by'
"""Metadata key of the `run_failed` event a cancel appends: who cancelled the run."""
CANCEL_REASON_KEY = 'stepcore.cancel_reason'
"""Metadata key of the `run_failed` event a cancel appends: why."""

_ATTEMPTS = 5


async def cancel_run(store: StepStoreProtocol, *, run_id: str, reason: str, by: str | None = None) -> Lease:
    """Cancel `run_id` (or its newest continuation): see the module docstring. Returns the run's lease,
    `ended` as `cancelled`, its `note` saying by whom and why.

    `reason` is required; `by` defaults to this host and process. Cancelling a run cancelled already
    changes nothing and returns its lease. Raises `RunClaimedError` when the run changed hands every time
    it was tried (try again), `ValueError` for a run that ended otherwise
    (completed, failed: there is nothing to stop) or a store without leases, `LookupError` for a run
    the store does not know.
    """
    if not isinstance(reason, str) or not reason.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f'cancel_run needs a reason (what a person reading the run later should know); got {reason!r}')
    who = by if by is not None else f'{socket.gethostname()} pid {os.getpid()}'
    bound = as_step_store(store)
    if not has_leases(bound):
        raise ValueError(
            f'{type(bound).__name__} keeps no leases, so nothing would stop the owner of run {run_id!r}: '
            'cancel_run needs a store with the feature `leases`'
        )
    with cancelling(bound, run_id) as cancelled:
        target = run_id
        for _ in range(_ATTEMPTS):
            target = (await continuations(bound, run_id))[-1]
            lease = await bound.get_lease(target)
            if lease is None and await bound.get_run(run_id=target) is None:
                raise LookupError(f'cannot cancel run {target!r}: the store has no such run')
            if lease is not None and lease.state is LeaseState.ENDED:
                if lease.cancelled:
                    return cancelled.done(lease)
                raise ValueError(
                    f'cannot cancel run {target!r}: it already ended ({lease.outcome or "ended"}), '
                    'so there is nothing to stop'
                )
            try:
                claim = await claim_run(bound, target, ttl=DEFAULT_LEASE_TTL, force=True, action='cancelled')
            except RunClaimedError:
                continue  # resumed or claimed meanwhile: follow it again
            with settling_under(Fence(claim.run_id, claim.epoch, claim.origin, store=bound)):
                await write_records(bound, [await _cancel_event(bound, target, who, reason)])
            ended = await claim.release(state=LeaseState.ENDED, outcome=CANCELLED, note=f'cancelled by {who}: {reason}')
            return cancelled.done(ended)
        raise RunClaimedError(
            run_id, await bound.get_lease(target), action=f'cancelled: it changed hands {_ATTEMPTS} times meanwhile'
        )


async def _cancel_event(store: StepStore, run_id: str, by: str, reason: str) -> StepEvent:
    return await run_end_event(
        store,
        run_id,
        EventKind.RUN_FAILED,
        error=f'cancelled by {by}: {reason}',
        metadata={CANCELLED_BY_KEY: by, CANCEL_REASON_KEY: reason},
        idempotency_key='run_failed:cancelled',
    )
