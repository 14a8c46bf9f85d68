"""`LeaseKeeper`: renews a running run's lease on a timer, so a step costs no extra write.

The keeper wakes every third of the lease's time to live and extends it by one compare-and-set on
its epoch. It runs on the run's event loop, beside the run: a tool that waits (an async tool, or a
sync one, which pydantic-ai runs on a thread) does not hold it up. When the swap finds another
epoch, the lease was taken over: the keeper stops and marks the run's fence as lost, and the run's
next write is refused by the store. A failed renewal (the store unreachable) is retried at the
next tick; the lease may expire meanwhile, and then another worker may take the run over, which
fences this one.

While a keeper runs, `kept_here(lease)` says the lease belongs to a run alive in this process: a
lease that expired only because its renewal came late (a starved event loop) is not an orphan to
this process's own recovery loop, which would otherwise claim and fence its own live run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from stepcore.store.leases import Fence, Lease
from stepcore.store.step_store import StepStore

__all__ = ('LeaseKeeper', 'kept_here')

logger = logging.getLogger('stepcore.ownership')

_KEEPING: dict[tuple[str, str], LeaseKeeper] = {}
"""The keepers running in this process, by run id and the token of the claim they keep."""


def kept_here(lease: Lease) -> bool:
    """Whether a keeper in this process is renewing `lease` (the same claim: run id and owner token)."""
    return lease.owner is not None and (lease.run_id, lease.owner.token) in _KEEPING


class LeaseKeeper:
    """Renews `lease` in `store` every `ttl / 3` seconds until `stop()` (see the module docstring)."""

    def __init__(self, store: StepStore, lease: Lease, fence: Fence, *, ttl: float) -> None:
        self.store = store
        self.lease = lease
        self.fence = fence
        self.ttl = ttl
        self.renewals = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start renewing, on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep(), name=f'lease of {self.lease.run_id}')
            _KEEPING[self._key] = self

    @property
    def _key(self) -> tuple[str, str]:
        owner = self.lease.owner
        return (self.lease.run_id, owner.token if owner is not None else '')

    def forget(self) -> None:
        """No longer count the lease as alive here: once it is let go, or the run abandoned."""
        if _KEEPING.get(self._key) is self:
            del _KEEPING[self._key]

    async def stop(self) -> None:
        """Stop renewing (the lease stays as last renewed, and alive here until `forget()`: the run
        is still letting it go)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def stop_soon(self) -> None:
        """Stop renewing without waiting (from code that cannot await), and forget the lease."""
        task, self._task = self._task, None
        self.forget()
        if task is not None:
            task.cancel()

    async def renew(self) -> bool:
        """Extend the lease once; False when it was taken over (the fence is then marked lost)."""
        renewed = replace(self.lease)
        swapped, now = await self.store.swap_lease(renewed, expect=self.lease.epoch, ttl=self.ttl)
        if swapped and now is not None:
            self.lease = now
            self.renewals += 1
            return True
        self.fence.lost = now
        logger.warning(
            'run %r lost its lease (epoch %d): %s; its next write will be refused',
            self.lease.run_id,
            self.lease.epoch,
            now.describe() if now is not None else 'the lease is gone',
        )
        return False

    async def _keep(self) -> None:
        period = max(self.ttl / 3, 0.01)
        me = asyncio.current_task()
        # `stop` unsets `_task` before it cancels: a cancellation that a driver swallows while a
        # renewal waits on it (a pool's wait_for racing its own completion) still ends the loop
        while self._task is me:
            await asyncio.sleep(period)
            if self._task is not me:
                return
            try:
                if not await self.renew():
                    return
            except asyncio.CancelledError:
                raise
            except Exception as error:
                logger.warning(
                    'could not renew the lease of run %r (%s: %s); retrying in %.1f s',
                    self.lease.run_id,
                    type(error).__name__,
                    error,
                    period,
                )
