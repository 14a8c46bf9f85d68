"""Recovery's claim on a run: taken where the store keeps leases, the fence a settlement runs under, and
letting it go after a failure.

Resolving by policy (`stepcore.recovery.resolution`) and settling by hand (`stepcore.recovery.by_hand`)
claim the run before they write, so of concurrent recoverers exactly one proceeds and a zombie of the
old owner is fenced; a store without leases has nothing to claim, and recovery says so (`unchecked`).
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any, Literal

from stepcore.capability.context import settling_under
from stepcore.ownership.claims import Claim, claim_run, has_leases
from stepcore.store.leases import Fence, RunClaimedError
from stepcore.store.step_store import StepStore

__all__ = ('Ownership', 'claim_for_recovery', 'fenced', 'release_quietly')

logger = logging.getLogger('stepcore.recovery')

Ownership = Literal['claimed', 'unchecked']
"""Whether recovery claimed the run on its store's lease (`claimed`), or the store keeps no leases, so
nothing tells whether another process still runs it (`unchecked`)."""


async def claim_for_recovery(
    store: StepStore, run_id: str, *, force: bool, ttl: float, action: str
) -> tuple[Claim | None, Ownership]:
    """Claim `run_id` on its store's lease (`claimed`); a store without leases has none to claim (`unchecked`)."""
    if not has_leases(store):
        return None, 'unchecked'
    return await claim_run(store, run_id, ttl=ttl, force=force, action=action), 'claimed'


def fenced(claim: Claim | None) -> Any:
    """Where a settlement runs: under the claim's fence, which reconcile functions get as their
    `fencing_token()` (nothing to fence without a claim)."""
    if claim is None:
        return nullcontext()
    return settling_under(Fence(claim.run_id, claim.epoch, claim.origin, store=claim.store))


async def release_quietly(claim: Claim | None) -> None:
    """Let a claim go after a failure, the run as it was, without hiding the failure (the claim
    expires anyway). A claim another worker took over meanwhile (it expired while this one was
    stopped) has nothing to let go: that is told, not warned of."""
    if claim is None:
        return
    try:
        await claim.restore()
    except RunClaimedError as error:  # the claim expired and another worker took the run: nothing to let go
        logger.info('the claim on run %r was taken over meanwhile: %s', claim.run_id, error)
    except Exception as error:
        logger.warning('could not let go of the claim on run %r: %s: %s', claim.run_id, type(error).__name__, error)
