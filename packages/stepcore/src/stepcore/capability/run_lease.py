"""The lease a `StepPersistence` run holds in its store: taken at the start, renewed, let go at the end.

- At the start (`before_run`) the run takes its lease, before it registers: a fresh one at epoch 1
  (with its start point, the history and prompt a restart needs), or, for a resumption started by
  `Resumption.run`, one epoch past recovery's claim on the run it continues, which is then marked
  resumed by it. A resumption whose run was taken meanwhile stops before it writes anything.
- While it runs, a `LeaseKeeper` renews it on a timer (no write per step) and the run's fence makes
  every write conditional on its epoch.
- At the end it is released: `ended` (completed or failed), `waiting` (paused on deferred tool
  calls), or, when the run was cancelled (a worker shutting down), left running and expired, so
  another worker resumes it at once. A run whose lease was taken over leaves it to the new owner.

No lease is taken under a durable engine (it owns the run's recovery), with `lease_ttl=None`, or on
a store that keeps none.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from pydantic_ai.tools import RunContext

from stepcore.capability.context import job_leased
from stepcore.capability.run_state import RunState
from stepcore.ownership.claims import Claim, open_lease
from stepcore.ownership.keeper import LeaseKeeper
from stepcore.store.leases import Lease, LeaseState, RunFencedError, with_change
from stepcore.store.models import utcnow
from stepcore.store.step_store import StepStore

__all__ = ('end_lease', 'start_point', 'take_lease')

logger = logging.getLogger('stepcore.ownership')


def start_point(ctx: RunContext[object], given: list[ModelMessage]) -> list[ModelMessage]:
    """What a restart of the run needs: the history it was given and a request with its prompt."""
    prompt = ctx.prompt
    if prompt is None:
        return list(given)
    return [*given, ModelRequest(parts=[UserPromptPart(content=prompt)])]


async def take_lease(
    store: StepStore,
    run: RunState,
    *,
    ttl: float,
    resumes: str | None,
    claim: Claim | None,
    start: list[ModelMessage] | None,
    version: str | None = None,
    job: str | None = None,
) -> Lease:
    """Take the run's lease (see the module docstring) and start renewing it; answers it (a
    resumption's carries its chain's version and job)."""
    if claim is not None:
        lease = await claim.hand_over(run.run_id, ttl=ttl, version=version)
    else:
        lease = await open_lease(store, run.run_id, ttl=ttl, resumes=resumes, start=start, version=version, job=job)
        if job is not None:
            job_leased(job)
    run.fence.epoch = lease.epoch
    run.fence.origin = lease.origin
    run.fence.store = store
    run.keeper = LeaseKeeper(store, lease, run.fence, ttl=ttl)
    run.keeper.start()
    return lease


async def end_lease(
    run: RunState, *, state: LeaseState, outcome: str, error: BaseException | None = None, crashed: bool = False
) -> None:
    """Stop renewing and let the lease go as `state` (see the module docstring); `crashed`: left running
    and expired at once, as a killed process's would be, so that recovery resumes the run."""
    keeper = run.keeper
    if keeper is None:
        return
    run.keeper = None
    try:
        await _let_go(run, keeper, state=state, outcome=outcome, error=error, crashed=crashed)
    finally:
        keeper.forget()  # counted alive here until now: this process's own recovery leaves it alone


async def _let_go(
    run: RunState, keeper: LeaseKeeper, *, state: LeaseState, outcome: str, error: BaseException | None, crashed: bool
) -> None:
    await keeper.stop()
    if isinstance(error, RunFencedError) or run.fence.lost is not None:
        return  # taken over: the lease is the new owner's
    lease = keeper.lease
    if isinstance(error, asyncio.CancelledError) or crashed:
        new = replace(lease, outcome='cancelled' if not crashed else outcome, since=utcnow())  # running, expired now
    else:
        new = replace(lease, state=state, owner=None, outcome=outcome, since=utcnow())
    try:
        swapped, now = await keeper.store.swap_lease(with_change(lease, new), expect=lease.epoch, ttl=0.0)
    except Exception as failure:
        logger.warning(
            'run %r could not release its lease (%s: %s): it will expire in at most %.0f s',
            run.run_id,
            type(failure).__name__,
            failure,
            keeper.ttl,
        )
        return
    if not swapped:
        run.fence.lost = now
