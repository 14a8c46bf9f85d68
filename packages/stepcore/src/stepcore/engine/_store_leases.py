"""Leases: a run's lease read, swapped (compare and set) and listed, and its start point.

A swap counts what the run holds first and seals the count into the lease's body (`_tally.py`);
it keeps the refused writes noted in the lease since its caller read it. The start point is the
history a restart of the run needs, stored with the lease as one sealed chain.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

from pydantic_ai.messages import ModelMessage

from stepcore.common.damage import DamagedRecordError, skip_damaged
from stepcore.common.features import LEASES, require_feature
from stepcore.engine._ops import GetLease, LeaseRead, LeaseRow, LeaseSwap, ListLeases, SwapLease
from stepcore.engine._seal import NO_PREV
from stepcore.engine._store_base import MAX_TTL, EngineBase
from stepcore.engine._tally import swap_plan, with_tally
from stepcore.store.codec import encode_message
from stepcore.store.leases import Change, Lease, LeaseState, encode_lease_body

__all__ = ('StoreLeases',)


def _keep_refusals(lease: Lease, stored: Lease | None) -> Lease:
    """`lease` (about to replace `stored`, at the same epoch) with the refused writes noted in
    `stored` that it does not hold (noted after its caller read the lease)."""
    if stored is None:
        return lease
    missing = [c for c in stored.history if c.what is Change.REFUSED and c not in lease.history]
    if not missing:
        return lease
    merged = sorted((*lease.history, *missing), key=lambda change: change.at)
    return replace(lease, history=tuple(merged))


class StoreLeases(EngineBase):
    """`EngineStore`'s leases (feature `leases`: see `stepcore.store.leases`)."""

    async def get_lease(self, run_id: str) -> Lease | None:
        """The run's lease, read with the store's clock; `None` when it has none."""
        require_feature(self, LEASES, option='get_lease')
        run_id = self._engine_run_id(run_id)
        return self._engine_lease(run_id, await self._engine_driver.read_op(run_id, GetLease(run_id)))

    async def swap_lease(
        self,
        lease: Lease,
        *,
        expect: int | None,
        expired: bool = False,
        ttl: float,
        start: Sequence[ModelMessage] | None = None,
    ) -> tuple[bool, Lease | None]:
        """Compare and set the run's lease (see `stepcore.engine._ops.SwapLease`): store `lease`, held
        for `ttl` seconds from now on the store's clock, when the run has no lease (`expect=None`) or
        its lease has epoch `expect` (and, with `expired`, has expired on the store's clock).

        `start` stores the history a restart of the run needs with it. Answers whether it matched and
        the lease as it is now.
        """
        require_feature(self, LEASES, option='swap_lease')
        run_id = self._engine_run_id(lease.run_id)
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 <= ttl < MAX_TTL:
            raise ValueError(f'ttl={ttl!r} cannot hold a lease: pass a finite number of seconds from 0 up')
        blob = None if start is None else await self.__seal_start(run_id, start)
        # what the run holds now, read before the swap: a lower bound of what any later read finds;
        # and its lease, for the refused writes noted in it since the caller read it (kept)
        tally, read = await self._engine_driver.read(run_id, lambda: swap_plan(run_id))
        if expect is not None and read.row is not None and read.row.epoch == expect:
            with contextlib.suppress(DamagedRecordError):  # a damaged lease has no notes to keep
                lease = _keep_refusals(lease, self._engine_lease(run_id, read))
        row = LeaseRow(
            run_id=run_id,
            epoch=lease.epoch,
            state=LeaseState(lease.state).value,
            host=lease.owner.host if lease.owner is not None else '',
            expires=0.0,
            body=with_tally(encode_lease_body(lease), run_id, tally),
        )
        op = SwapLease(run_id, expect=expect, expired=expired, row=row, ttl=float(ttl), start=blob)
        swap = cast(LeaseSwap, await self._engine_driver.write_op([run_id], op, retry=False))
        return swap.swapped, self._engine_lease(run_id, swap.read)

    async def list_leases(self, states: Sequence[LeaseState | str]) -> list[Lease]:
        """The leases in one of `states` (never `ended`), through the store's index of states."""
        require_feature(self, LEASES, option='list_leases')
        wanted = tuple(LeaseState(s).value for s in states)
        if LeaseState.ENDED.value in wanted:
            raise ValueError("list_leases lists live states only: leave 'ended' out (every finished run has it)")
        rows, now = cast(tuple[Sequence[LeaseRow], float], await self._engine_driver.read_op(None, ListLeases(wanted)))
        found: list[Lease] = []
        for row in rows:
            try:
                lease = self._engine_lease(row.run_id, LeaseRead(row, now))
            except DamagedRecordError as error:
                skip_damaged(error)
                continue
            if lease is not None:
                found.append(lease)
        return found

    async def lease_start(self, run_id: str) -> list[ModelMessage] | None:
        """The history stored with the run's lease for a restart (its first request), or `None`."""
        require_feature(self, LEASES, option='lease_start')
        run_id = self._engine_run_id(run_id)
        stored = await self._engine_start(run_id)
        if stored is None:
            return None
        try:
            return await self._engine_history.decode(stored)
        except (ValueError, LookupError, TypeError) as error:
            raise DamagedRecordError(
                run_id=run_id,
                record='start point',
                where=self._engine_where(),
                reason=f'{type(error).__name__}: {error}',
            ) from error

    async def __seal_start(self, run_id: str, messages: Sequence[ModelMessage]) -> bytes:
        """The start point's stored form: its messages' stored bodies sealed as one chain, one per line."""
        walker = self._engine_history.walker
        stored = [await walker.externalize(encode_message(m)) for m in messages]
        bodies, sums = self._engine_sealer.nodes(run_id, stored, NO_PREV)
        return (sums[-1] if sums else '').encode() + b'\n' + b'\n'.join(bodies)
