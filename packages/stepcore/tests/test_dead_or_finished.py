"""A run that finished is never set dead, whatever deaths its chain counted before."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from stepcore import InMemoryStepStore, StepPersistence, resolve_run
from stepcore.store.leases import DiedAttempt, LeaseState


async def test_a_run_that_wrote_its_end_before_its_owner_died_is_finished_not_dead() -> None:
    store = InMemoryStepStore()
    agent = Agent(TestModel(), name='clerk', capabilities=[StepPersistence(store=store, run_id='r', lease_ttl=30)])
    await agent.run('hello')
    ended = await store.get_lease('r')
    assert ended is not None
    # its records say it finished, but its lease says an owner still runs it, after five deaths: the owner
    # died after it wrote its end and before it let go of the lease
    deaths = tuple(DiedAttempt(f'r-{n}', 'vm pid 1', n, 'owner gone') for n in range(1, 6))
    stuck = replace(ended, state=LeaseState.RUNNING, outcome=None, note=None, died=deaths)
    swapped, _ = await store.swap_lease(stuck, expect=ended.epoch, ttl=0.01)
    assert swapped
    await asyncio.sleep(0.05)  # its lease expires

    resumption = await resolve_run(store, run_id='r', agent=Agent(TestModel()), max_recovery_attempts=5)
    assert resumption.finished
    lease = await store.get_lease('r')
    assert lease is not None
    assert lease.state is LeaseState.ENDED
    assert lease.outcome == 'completed'
