"""A note added to a lease by a process that does not own it (a refused write) never undoes a change
the owner made at the same epoch: the swap that adds it expects the lease's expiry as read, and
every backend's swap compares it on the server."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, cast

import pytest

import stepcore
from stepcore.engine._driver import Driver
from stepcore.engine._ops import GetLease, LeaseRead, LeaseRow, LeaseSwap, SwapLease
from stepcore.ownership import claim_run, open_lease
from stepcore.store.leases import LeaseState
from stepcore.store.step_store import StepStore

_SERVERS = {'postgres': 'STEP_POSTGRES_URL', 'redis': 'STEP_REDIS_URL', 'mongo': 'STEP_MONGO_URL'}


@pytest.fixture(params=['sqlite', 'file', 'postgres', 'redis', 'mongo'])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    backend = cast(str, request.param)
    if backend == 'sqlite':
        return {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')}
    if backend == 'file':
        return {'backend': 'file', 'directory': str(tmp_path / 'runs')}
    url = os.environ.get(_SERVERS[backend])
    if not url:
        pytest.fail(f'{_SERVERS[backend]} is not set: start the test servers (scripts/test.sh does)')
    name = f'guard_{uuid.uuid4().hex[:10]}'
    if backend == 'postgres':
        return {'backend': 'postgres', 'dsn': url, 'table_prefix': name}
    if backend == 'redis':
        return {'backend': 'redis', 'url': url, 'key_prefix': name}
    return {'backend': 'mongo', 'db_url': url, 'database': name}


async def test_a_swap_expecting_an_expiry_misses_a_lease_swapped_since(spec: dict[str, Any]) -> None:
    store = cast(StepStore, stepcore.from_spec(**spec))
    try:
        run_id = f'guarded-{uuid.uuid4().hex[:8]}'
        await open_lease(store, run_id, ttl=0.0)
        claim = await claim_run(store, run_id, ttl=60.0)
        driver = Driver(cast(Any, store).port, 'test')
        read = cast(LeaseRead, await driver.read_op(run_id, GetLease(run_id)))
        assert read.row is not None
        seen = read.row
        # the owner changes the lease at the same epoch after the note's read
        await claim.release(state=LeaseState.PENDING, note='a person decides')

        def note(expires: float) -> SwapLease:
            row = LeaseRow(run_id, seen.epoch, seen.state, seen.host, 0.0, seen.body)
            return SwapLease(run_id, expect=seen.epoch, expired=False, row=row, ttl=5.0, expect_expires=expires)

        missed = cast(LeaseSwap, await driver.write_op([run_id], note(seen.expires), retry=False))
        assert not missed.swapped, 'the lease was swapped since it was read: the note must not land'
        lease = await store.get_lease(run_id)
        assert lease is not None
        assert (lease.state, lease.note) == (LeaseState.PENDING, 'a person decides')
        now = cast(LeaseRead, await driver.read_op(run_id, GetLease(run_id)))
        assert now.row is not None
        landed = cast(LeaseSwap, await driver.write_op([run_id], note(now.row.expires), retry=False))
        assert landed.swapped, 'the expiry as read now matches'
    finally:
        await store.aclose()
