"""Jobs: `start_job` runs an agent under a caller-chosen id, once however often it is submitted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.models.test import TestModel

from stepcore import (
    InMemoryStepStore,
    JobExistsError,
    StepPersistence,
    fencing_token,
    job_runs,
    recover_orphans,
    recovery_policy,
    start_job,
)
from stepcore.store.leases import LeaseState
from stepcore_conformance.capability import function_model


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if any(isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts):
        return ModelResponse(parts=[TextPart('shipped')])
    return ModelResponse(parts=[ToolCallPart('ship', {}, tool_call_id='s1')])


class Shop:
    def __init__(self) -> None:
        self.shipped: list[str] = []
        """The origin (the job id) of each shipment's fencing token."""
        self.by_run: list[str] = []
        """The run that made each shipment."""
        self.gate = asyncio.Event()
        self.gate.set()
        self.inside = asyncio.Event()

    def agent(self, store: InMemoryStepStore, **options: Any) -> Agent[None, str]:
        agent = Agent(
            function_model(_model), name='shop', capabilities=[StepPersistence(store=store, lease_ttl=0.3, **options)]
        )

        @agent.tool_plain
        @recovery_policy('rerun')
        async def ship() -> str:  # pyright: ignore[reportUnusedFunction]
            self.inside.set()
            await self.gate.wait()
            token = fencing_token()
            assert token is not None
            self.shipped.append(token.origin)
            self.by_run.append(token.run_id)
            return 'ok'

        return agent


async def test_a_job_starts_once_and_a_second_submission_gets_its_outcome() -> None:
    store = InMemoryStepStore()
    shop = Shop()
    first = await start_job(shop.agent(store), 'ship order 42', job_id='order-42')
    assert (first.job_id, first.started, first.run_id, first.status) == ('order-42', True, 'order-42', 'completed')
    assert first.result is not None
    assert first.result.output == 'shipped'
    again = await start_job(shop.agent(store), 'ship order 42', job_id='order-42')
    assert (again.started, again.run_id, again.status, again.result) == (False, 'order-42', 'completed', None)
    assert shop.shipped == ['order-42']  # the tool's token carries the job id as its origin
    record = await store.get_run(run_id='order-42')
    assert record is not None
    assert record.metadata['stepcore.job'] == 'order-42'
    lease = await store.get_lease('order-42')
    assert lease is not None
    assert lease.job == 'order-42'
    with pytest.raises(JobExistsError, match="job 'order-42' was started already and is completed"):
        await start_job(shop.agent(store), 'ship order 42', job_id='order-42', on_conflict='fail')


async def test_two_submissions_at_once_run_it_once() -> None:
    store = InMemoryStepStore()
    shop = Shop()
    shop.gate.clear()
    first = asyncio.create_task(start_job(shop.agent(store), 'ship', job_id='order-7'))
    await asyncio.wait_for(shop.inside.wait(), 10)
    second = asyncio.create_task(start_job(shop.agent(store), 'ship', job_id='order-7', poll=0.02))
    await asyncio.sleep(0.2)
    assert not second.done()  # it waits for the job the first submission runs
    with pytest.raises(JobExistsError, match='is running'):
        await start_job(shop.agent(store), 'ship', job_id='order-7', on_conflict='fail')
    shop.gate.set()
    ran, waited = await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert (ran.started, ran.status) == (True, 'completed')
    assert (waited.started, waited.status, waited.run_id) == (False, 'completed', 'order-7')
    assert shop.shipped == ['order-7']


async def test_a_wait_that_times_out_says_the_job_is_running() -> None:
    store = InMemoryStepStore()
    shop = Shop()
    shop.gate.clear()
    first = asyncio.create_task(start_job(shop.agent(store), 'ship', job_id='slow'))
    await asyncio.wait_for(shop.inside.wait(), 10)
    waited = await start_job(shop.agent(store), 'ship', job_id='slow', wait=0.1, poll=0.02)
    assert (waited.started, waited.status) == (False, 'running')
    shop.gate.set()
    await first


async def test_a_resumed_job_keeps_its_id_through_its_resumptions() -> None:
    store = InMemoryStepStore()
    shop = Shop()
    shop.gate.clear()
    task = asyncio.create_task(start_job(shop.agent(store), 'ship', job_id='order-9'))
    await asyncio.wait_for(shop.inside.wait(), 10)
    task.cancel()  # the worker goes away inside the tool
    with pytest.raises(asyncio.CancelledError):
        await task
    shop.gate.set()
    await asyncio.sleep(0.35)
    (outcome,) = await recover_orphans(store, [shop.agent(store)])
    assert outcome.outcome == 'resumed'
    assert outcome.resumed_as is not None
    runs = await job_runs(store, 'order-9')
    assert [r.run_id for r in runs] == ['order-9', outcome.resumed_as]
    newest = runs[-1]
    assert newest.lease is not None
    assert (newest.lease.job, newest.lease.state) == ('order-9', LeaseState.ENDED)
    record = await store.get_run(run_id=outcome.resumed_as)
    assert record is not None
    assert record.metadata['stepcore.job'] == 'order-9'
    # The re-run's token has the job id as origin too. (A cancelled run's tool may still finish on
    # some pydantic-ai releases: only the resumption's shipment is counted here.)
    assert outcome.resumed_as in shop.by_run
    assert shop.by_run.count(outcome.resumed_as) == 1
    assert set(shop.shipped) == {'order-9'}
    again = await start_job(shop.agent(store), 'ship', job_id='order-9')
    assert (again.started, again.run_id, again.status) == (False, outcome.resumed_as, 'completed')


async def test_a_delegate_inside_a_job_runs_under_its_own_id() -> None:
    store = InMemoryStepStore()
    helper = Agent(TestModel(), name='helper', capabilities=[StepPersistence(store=store)])
    boss = Agent(
        function_model(
            lambda messages, info: ModelResponse(parts=[TextPart('done')])
            if len(messages) > 1
            else ModelResponse(parts=[ToolCallPart('ask_helper', {}, tool_call_id='h1')])
        ),
        name='boss',
        capabilities=[StepPersistence(store=store)],
    )

    @boss.tool_plain
    async def ask_helper() -> str:  # pyright: ignore[reportUnusedFunction]
        return (await helper.run('help')).output

    done = await start_job(boss, 'go', job_id='job-with-delegate')
    assert (done.started, done.status) == (True, 'completed')
    runs = {r.run_id: r for r in await store.list_runs()}
    assert 'job-with-delegate' in runs
    (child,) = [r for r in runs.values() if r.parent_run_id == 'job-with-delegate']
    assert child.run_id != 'job-with-delegate'
    assert 'stepcore.job' not in child.metadata


async def test_bad_arguments_are_refused_before_anything_runs() -> None:
    store = InMemoryStepStore()
    shop = Shop()
    with pytest.raises(ValueError, match='run_id'):
        await start_job(shop.agent(store, run_id='fixed'), 'ship', job_id='other')
    with pytest.raises(ValueError, match="on_conflict='sometimes' is not a policy"):
        await start_job(shop.agent(store), 'ship', job_id='x', on_conflict='sometimes')  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match='is not path-safe'):
        await start_job(shop.agent(store), 'ship', job_id='../escape')
    with pytest.raises(ValueError, match='StepPersistence'):
        await start_job(Agent(TestModel()), 'hi', job_id='bare')
    with pytest.raises(LookupError, match="no job 'nothing'"):
        await job_runs(store, 'nothing')
    assert shop.shipped == []
