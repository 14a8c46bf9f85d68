"""Taking a run's lease, and handing it on: the compare-and-set steps every owner goes through.

- A new run takes a fresh lease (`open_lease`): epoch 1, or one past the run it resumes.
- Recovery takes over a run (`claim_run`): only when no live owner holds it (its lease expired on
  the store's clock, its owner is provably gone on this host, or `force`), by one compare-and-set
  that raises the epoch, so of many claimers exactly one wins and the old owner is fenced.
- A claim ends by handing the run to its resumption (`Claim.hand_over`), by settling it for a
  person (`Claim.release(state=PENDING)`), or by letting go at once so another worker may take it
  (`Claim.release()`).

Every step is one `swap_lease` on the store; nothing here reads a clock of its own to decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from pydantic_ai.messages import ModelMessage

from stepcore.common.features import LEASES
from stepcore.common.telemetry import claiming, lease_opened
from stepcore.ownership.identity import new_owner, owner_gone
from stepcore.store.contract import as_step_store
from stepcore.store.leases import (
    CANCELLED,
    Change,
    DiedAttempt,
    Lease,
    LeaseState,
    Owner,
    RunCancelledError,
    RunClaimedError,
    RunOwnedError,
    from_seconds,
    with_change,
)
from stepcore.store.models import utcnow
from stepcore.store.step_store import StepStore

__all__ = ('Claim', 'claim_run', 'has_leases', 'lease_template', 'live', 'open_lease', 'read_lease')

_NEVER = from_seconds(0)


def has_leases(store: object) -> bool:
    """Whether the store keeps run ownership (declares the feature `leases` on its class)."""
    bound = as_step_store(store)
    features: frozenset[str] = getattr(type(bound), 'features', frozenset())
    return LEASES in features


async def read_lease(store: object, run_id: str) -> Lease | None:
    """The run's lease, or `None` (also on a store without leases)."""
    bound = as_step_store(store)
    return await bound.get_lease(run_id) if has_leases(bound) else None


def live(lease: Lease | None) -> bool:
    """Whether a live owner holds the run: running, not expired on the store's clock, and not
    provably gone on this host."""
    return lease is not None and lease.state is LeaseState.RUNNING and not lease.expired and not owner_gone(lease)


def lease_template(
    run_id: str,
    *,
    epoch: int,
    state: LeaseState,
    owner: Owner | None,
    origin: str | None,
    resumes: str | None = None,
    resumed_by: str | None = None,
    outcome: str | None = None,
    note: str | None = None,
    since: datetime | None = None,
    version: str | None = None,
    died: tuple[DiedAttempt, ...] = (),
    job: str | None = None,
) -> Lease:
    """A lease to store (its expiry is set by the store, from the ttl of the swap)."""
    return Lease(
        run_id=run_id,
        epoch=epoch,
        state=state,
        owner=owner,
        expires_at=_NEVER,
        checked_at=_NEVER,
        since=since or utcnow(),
        origin=origin,
        resumes=resumes,
        resumed_by=resumed_by,
        outcome=outcome,
        note=note,
        version=version,
        died=died,
        job=job,
    )


async def open_lease(
    store: StepStore,
    run_id: str,
    *,
    ttl: float,
    epoch: int = 1,
    origin: str | None = None,
    resumes: str | None = None,
    owner: Owner | None = None,
    start: Sequence[ModelMessage] | None = None,
    version: str | None = None,
    died: tuple[DiedAttempt, ...] = (),
    job: str | None = None,
) -> Lease:
    """Take the lease of a run that has none (a new run); `RunClaimedError` when it has one."""
    lease = lease_template(
        run_id,
        epoch=epoch,
        state=LeaseState.RUNNING,
        owner=owner or new_owner(),
        origin=origin or run_id,
        resumes=resumes,
        version=version,
        died=died,
        job=job,
    )
    swapped, now = await store.swap_lease(with_change(None, lease), expect=None, ttl=ttl, start=start)
    if not swapped or now is None:
        raise RunClaimedError(run_id, now, action='started: its id already holds a lease')
    lease_opened(run_id, now.origin)
    return now


@dataclass
class Claim:
    """A run this process took over for recovery, at `lease.epoch`: its writes to the run are fenced
    with that epoch, and it ends by `hand_over`, `release` or simply expiring."""

    store: StepStore
    lease: Lease
    ttl: float
    forced: bool = False
    previous: Lease | None = None
    """The lease as it was before the claim (`None`: the run had none)."""

    @property
    def run_id(self) -> str:
        return self.lease.run_id

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def origin(self) -> str:
        return self.lease.origin or self.lease.run_id

    async def _swap(
        self, new: Lease, *, ttl: float, action: str, what: Change | None = None, detail: str | None = None
    ) -> Lease:
        noted = with_change(self.lease, new, what=what, detail=detail)
        swapped, now = await self.store.swap_lease(noted, expect=self.epoch, ttl=ttl)
        if not swapped or now is None:
            raise RunClaimedError(self.run_id, now, action=action)
        self.lease = now
        return now

    async def renew(self) -> Lease:
        """Hold the run for another `ttl` seconds; `RunClaimedError` when it was taken meanwhile."""
        return await self._swap(replace(self.lease, since=self.lease.since), ttl=self.ttl, action='held any longer')

    async def release(
        self,
        *,
        state: LeaseState = LeaseState.RUNNING,
        outcome: str | None = None,
        note: str | None = None,
        detail: str | None = None,
    ) -> Lease:
        """Let the run go: at once claimable again (`RUNNING`, expired now), waiting for a person
        (`PENDING`, with `note`), or finished (`ENDED`, with `outcome`)."""
        owner = self.lease.owner if state is LeaseState.RUNNING else None
        new = replace(self.lease, state=state, owner=owner, outcome=outcome, note=note, since=utcnow())
        return await self._swap(new, ttl=0.0, action='released', what=Change.RELEASED, detail=detail)

    async def restore(self) -> Lease:
        """Let the run go as it was before the claim (a finished run stays finished, a pending one
        pending), at the claim's epoch; a run that was running (an orphan), or had no lease, is left
        claimable at once."""
        previous = self.previous
        if previous is None or previous.state is LeaseState.RUNNING:
            return await self.release()
        return await self.release(state=previous.state, outcome=previous.outcome, note=previous.note)

    async def hand_over(
        self, to_run: str, *, ttl: float, owner: Owner | None = None, version: str | None = None
    ) -> Lease:
        """Give the run to its resumption `to_run`: the resumption's own lease is taken one epoch past
        this claim's (with the chain's version, or `version` when the chain has none), then this run is
        marked resumed by it at that epoch (fencing anything still written under the claim). Answers
        the resumption's lease; `RunClaimedError` when the run was taken over meanwhile, and then the
        resumption's lease is let go."""
        epoch = self.epoch + 1
        mine = await open_lease(
            self.store,
            to_run,
            ttl=ttl,
            epoch=epoch,
            origin=self.origin,
            resumes=self.run_id,
            owner=owner,
            version=self.lease.version if self.lease.version is not None else version,
            died=self.lease.died,
            job=self.lease.job,
        )
        resumed = replace(
            self.lease, epoch=epoch, state=LeaseState.RESUMED, owner=None, resumed_by=to_run, since=utcnow()
        )
        try:
            await self._swap(resumed, ttl=0.0, action=f'resumed by {to_run!r}')
        except RunClaimedError:
            refused = replace(mine, state=LeaseState.ENDED, owner=None, outcome='refused', since=utcnow())
            await self.store.swap_lease(with_change(mine, refused), expect=mine.epoch, ttl=0.0)
            raise
        return mine


def _why_taken(lease: Lease, force: bool) -> str:
    """Why a claim may take `lease`, as the history tells it."""
    if lease.state is not LeaseState.RUNNING:
        why = f'it was {lease.state.value}'
    elif owner_gone(lease):
        why = 'owner gone'
    elif lease.expired:
        why = 'lease expired'
    elif force:
        why = 'forced'
    else:
        why = 'let go'
    return why


def _died(lease: Lease) -> DiedAttempt | None:
    """The death a claim of `lease` finds: a resumption whose own process ran it (not a claim for
    recovery let go) and is gone, or whose lease expired; `None` for anything else (a new run's first
    owner, a live run taken by force, a run that waits or ended)."""
    if lease.state is not LeaseState.RUNNING or lease.resumes is None or lease.outcome == CANCELLED:
        return None  # not running, no resumption, or let go when its task was cancelled (a shutdown)
    owner = lease.owner
    if owner is not None and owner.role != 'run':
        return None
    why = 'owner gone' if owner_gone(lease) else 'lease expired' if lease.expired else None
    if why is None:
        return None
    return DiedAttempt(
        lease.run_id, str(owner) if owner is not None else 'an unknown owner', lease.epoch, why, utcnow()
    )


async def claim_run(
    store: object,
    run_id: str,
    *,
    ttl: float,
    force: bool = False,
    action: str = 'recovery',
    owner: Owner | None = None,
) -> Claim:
    """Take over `run_id` for recovery, in one compare-and-set that raises its epoch.

    Refuses (`RunOwnedError`) a run a live owner holds (another claim for recovery too, even one of
    this process: of concurrent claimers exactly one proceeds), unless `force`; refuses (`RunClaimedError`)
    a run another claimer took first, or one already resumed by another run (follow it instead), and
    (`RunCancelledError`, even with `force`) a run that was cancelled. A
    run with no lease (started without one, or before leases) gets its first. The store must keep
    leases (`has_leases`).
    """
    bound = as_step_store(store)
    with claiming(bound, run_id, action=action, force=force) as claimed:
        lease = await bound.get_lease(run_id)
        me = owner or new_owner('recovery')
        if lease is None:
            fresh = lease_template(run_id, epoch=1, state=LeaseState.RUNNING, owner=me, origin=run_id)
            swapped, now = await bound.swap_lease(
                with_change(None, fresh, detail='it had no lease'), expect=None, ttl=ttl
            )
            if not swapped or now is None:
                raise RunClaimedError(run_id, now, action=f'claimed for {action}')
            return claimed.won(Claim(bound, now, ttl, forced=force, previous=None))
        if lease.state is LeaseState.RESUMED:
            raise RunClaimedError(run_id, lease, action=f'claimed for {action}')
        if lease.cancelled:
            raise RunCancelledError(lease, action=f'claimed for {action}')
        expired_only = False
        if lease.state is LeaseState.RUNNING and not owner_gone(lease):
            if not lease.expired:
                if not force:
                    raise RunOwnedError(lease, action=action)
            else:
                expired_only = not force  # a renewal between our read and our swap must win
        new = replace(
            lease,
            epoch=lease.epoch + 1,
            state=LeaseState.RUNNING,
            owner=me,
            outcome=None,
            note=None,
            since=utcnow(),
            died=(*lease.died, died) if (died := _died(lease)) is not None else lease.died,
        )
        new = with_change(lease, new, what=Change.TAKEN_OVER, detail=_why_taken(lease, force))
        swapped, now = await bound.swap_lease(new, expect=lease.epoch, expired=expired_only, ttl=ttl)
        if not swapped or now is None:
            if now is not None and live(now) and not force:
                raise RunOwnedError(now, action=action)
            if now is not None and now.cancelled:
                raise RunCancelledError(now, action=f'claimed for {action}')
            raise RunClaimedError(run_id, now, action=f'claimed for {action}')
        return claimed.won(Claim(bound, now, ttl, forced=force, previous=lease))
