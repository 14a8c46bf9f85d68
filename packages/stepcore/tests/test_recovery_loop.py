"""The recovery loop is continuous: it claims orphans as they appear and as room frees, and reports
each outcome when that orphan is done; an orphan's end as `abandoned` is reported once in a fleet."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo

from stepcore import (
    InMemoryStepStore,
    OrphanOutcome,
    StepPersistence,
    fencing_token,
    list_orphans,
    recover_orphans,
    recovery_policy,
    resolve_run,
    run_recovery_loop,
)
from stepcore.ownership.claims import open_lease
from stepcore.recovery.fleet import suspect
from stepcore.store.leases import LeaseState, Owner
from stepcore_conformance.capability import function_model

TTL = 0.2


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = any(isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts)
    if returned:
        return ModelResponse(parts=[TextPart('done')])
    return ModelResponse(parts=[ToolCallPart('work', {}, tool_call_id='w1')])


class World:
    """The agent's tool: it blocks while its run's gate is closed, and says when it is in."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.inside: dict[str, asyncio.Event] = {}

    def gate(self, run_id: str) -> asyncio.Event:
        return self.gates.setdefault(run_id, asyncio.Event())

    def entered(self, run_id: str) -> asyncio.Event:
        return self.inside.setdefault(run_id, asyncio.Event())

    def agent(
        self,
        store: InMemoryStepStore,
        run_id: str | None = None,
        version: str | None = None,
        *,
        declared: bool = True,
        default: Any = None,
    ) -> Agent[None, str]:
        agent = Agent(
            function_model(_model),
            name='worker',
            capabilities=[
                StepPersistence(
                    store=store, run_id=run_id, lease_ttl=TTL, version=version, default_recovery_policy=default
                )
            ],
        )

        async def work() -> str:
            token = fencing_token()  # its origin: the run the chain of resumptions began with
            origin = token.origin if token is not None else ''
            self.entered(origin).set()
            await self.gate(origin).wait()
            return 'worked'

        agent.tool_plain(recovery_policy('rerun')(work) if declared else work)
        return agent


async def _stopped_inside_its_tool(world: World, origin: str, run: Coroutine[Any, Any, Any]) -> None:
    """Run `run` (of the chain `origin`) until its tool is entered, then stop it there, as a killed
    process stops: its lease is left running, to expire."""
    task = asyncio.create_task(run)
    await asyncio.wait_for(world.entered(origin).wait(), 5)
    world.entered(origin).clear()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _orphan(store: InMemoryStepStore, world: World, run_id: str, version: str | None = None) -> None:
    """A run of `run_id` whose process stopped inside its tool: its lease expires `TTL` later."""
    world.gate(run_id)
    await _stopped_inside_its_tool(world, run_id, world.agent(store, run_id, version).run('go'))
    lease = await store.get_lease(run_id)
    assert lease is not None
    assert lease.state is LeaseState.RUNNING


class Outcomes(list[OrphanOutcome]):
    """What the loop reported, in order; `until` waits for a run's."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = asyncio.Event()

    def add(self, outcome: OrphanOutcome) -> None:
        self.append(outcome)
        self.arrived.set()

    async def until(self, run_id: str, seconds: float = 10.0) -> OrphanOutcome:
        async with asyncio.timeout(seconds):
            while not (found := [o for o in self if o.run_id == run_id]):
                self.arrived.clear()
                await self.arrived.wait()
        return found[0]


@contextlib.asynccontextmanager
async def recovering(store: InMemoryStepStore, world: World, **options: Any) -> AsyncIterator[Outcomes]:
    """The recovery loop running on `store` with the world's agent (a 0.05 s tick unless `options` say
    otherwise), and its outcomes as they come; stopped, and waited for, on leaving."""
    outcomes = Outcomes()
    stop = asyncio.Event()
    options.setdefault('interval', 0.05)
    loop = asyncio.create_task(
        run_recovery_loop(store, [world.agent(store)], stop=stop, on_outcome=outcomes.add, **options)
    )
    try:
        yield outcomes
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)


async def test_each_outcome_is_reported_when_its_orphan_is_done() -> None:
    store = InMemoryStepStore()
    world = World()
    await _orphan(store, world, 'quick')
    await _orphan(store, world, 'slow')
    world.gate('quick').set()  # the quick one's re-run returns at once; the slow one's blocks
    async with recovering(store, world) as outcomes:
        try:
            quick = await outcomes.until('quick')
            assert quick.outcome == 'resumed'
            assert not world.gate('slow').is_set()
            assert [o.run_id for o in outcomes] == ['quick']  # reported while the slow one still runs
            world.gate('slow').set()
            assert (await outcomes.until('slow')).outcome == 'resumed'
        finally:
            world.gate('slow').set()


async def test_an_orphan_appearing_while_a_resumption_runs_is_claimed_at_the_next_tick() -> None:
    store = InMemoryStepStore()
    world = World()
    await _orphan(store, world, 'long')
    async with recovering(store, world) as outcomes:
        try:
            await asyncio.wait_for(world.entered('long').wait(), 10)  # the long one is being resumed
            await _orphan(store, world, 'later')
            world.gate('later').set()
            later = await outcomes.until('later')  # no pass waits for the long one first
            assert later.outcome == 'resumed'
            assert not world.gate('long').is_set()
        finally:
            world.gate('long').set()
    assert {o.run_id: o.outcome for o in outcomes} == {'later': 'resumed', 'long': 'resumed'}


async def test_room_freed_is_filled_at_once_not_at_the_next_tick() -> None:
    store = InMemoryStepStore()
    world = World()
    for run_id in ('one', 'two', 'three'):
        await _orphan(store, world, run_id)
        world.gate(run_id).set()
    # One at a time, and a tick far longer than the test: only a freed slot can start the next.
    async with recovering(store, world, interval=60.0, concurrency=1) as outcomes:
        for run_id in ('one', 'two', 'three'):
            assert (await outcomes.until(run_id)).outcome == 'resumed'


async def test_stopping_lets_the_resumptions_under_way_finish() -> None:
    store = InMemoryStepStore()
    world = World()
    await _orphan(store, world, 'busy')
    outcomes = Outcomes()
    stop = asyncio.Event()
    loop = asyncio.create_task(
        run_recovery_loop(store, [world.agent(store)], interval=0.05, stop=stop, on_outcome=outcomes.add)
    )
    await asyncio.wait_for(world.entered('busy').wait(), 10)
    stop.set()
    await asyncio.sleep(0.2)
    assert not loop.done()  # it waits for the resumption it started
    world.gate('busy').set()
    await asyncio.wait_for(loop, 10)
    assert [(o.run_id, o.outcome) for o in outcomes] == [('busy', 'resumed')]


async def test_an_orphan_with_nothing_to_resume_is_reported_abandoned_by_one_worker() -> None:
    store = InMemoryStepStore()
    elsewhere = Owner(host='another-host', pid=4242, token='gone')
    run_ids = [f'empty-{n}' for n in range(6)]
    for run_id in run_ids:  # a lease and nothing else: killed between taking its lease and registering
        await open_lease(store, run_id, ttl=0.0, owner=elsewhere)
    await asyncio.sleep(0.01)
    world = World()
    passes = await asyncio.gather(*(recover_orphans(store, [world.agent(store)]) for _ in range(4)))
    abandoned = [o.run_id for outcomes in passes for o in outcomes if o.outcome == 'abandoned']
    assert sorted(abandoned) == run_ids  # each once
    for run_id in run_ids:
        lease = await store.get_lease(run_id)
        assert lease is not None
        assert (lease.state, lease.outcome) == (LeaseState.ENDED, 'abandoned')


async def test_an_on_outcome_that_raises_does_not_stop_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryStepStore()
    world = World()
    for run_id in ('first', 'second'):
        await _orphan(store, world, run_id)
        world.gate(run_id).set()
    seen = Outcomes()

    def broken(outcome: OrphanOutcome) -> Any:
        seen.add(outcome)
        raise RuntimeError('dashboard down')

    stop = asyncio.Event()
    loop = asyncio.create_task(
        run_recovery_loop(store, [world.agent(store)], interval=0.05, stop=stop, on_outcome=broken, concurrency=1)
    )
    try:
        await seen.until('first')
        await seen.until('second')
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)
    assert sorted(o.run_id for o in seen) == ['first', 'second']
    assert 'dashboard down' in caplog.text


async def test_an_orphan_is_resumed_only_by_a_worker_of_its_version() -> None:
    store = InMemoryStepStore()
    world = World()
    await _orphan(store, world, 'old-code', version='v1')
    world.gate('old-code').set()
    await asyncio.sleep(TTL + 0.05)
    for served, said in (('v2', "version 'v2'"), (None, 'no version')):
        (left,) = await recover_orphans(store, [world.agent(store, version=served)])
        assert (left.run_id, left.outcome) == ('old-code', 'other version')
        assert left.detail == f"run is version 'v1', this worker runs {said}: left for a worker of 'v1'"
    lease = await store.get_lease('old-code')
    assert lease is not None
    assert (lease.state, lease.version) == (LeaseState.RUNNING, 'v1')  # untouched: not even claimed
    (done,) = await recover_orphans(store, [world.agent(store, version='v1')])
    assert done.outcome == 'resumed'
    assert done.resumed_as is not None
    resumed = await store.get_lease(done.resumed_as)
    record = await store.get_run(run_id=done.resumed_as)
    assert resumed is not None
    assert record is not None
    assert (resumed.version, record.metadata['stepcore.version']) == ('v1', 'v1')
    original = await store.get_run(run_id='old-code')
    assert original is not None
    assert original.metadata['stepcore.version'] == 'v1'


def test_a_version_must_be_a_non_empty_string() -> None:
    for bad in ('', '  ', 3):
        with pytest.raises(ValueError, match='is no version: pass a non-empty string'):
            StepPersistence(version=bad)  # pyright: ignore[reportArgumentType]


async def test_a_tool_without_a_policy_is_reported_and_an_agent_default_settles_it() -> None:
    store = InMemoryStepStore()
    world = World()
    await _orphan(store, world, 'bare')
    world.gate('bare').set()
    await asyncio.sleep(TTL + 0.05)
    (left,) = await recover_orphans(store, [world.agent(store, declared=False)])
    assert left.outcome == 'pending'
    assert 'tools with no recovery policy, so a person decides: work' in left.detail
    assert 'default_recovery_policy' in left.detail
    lease = await store.get_lease('bare')
    assert lease is not None
    assert lease.state is LeaseState.PENDING
    # the same tool, its agent now saying how its tools are settled: it runs again
    done = await resolve_run(store, run_id='bare', agent=world.agent(store, declared=False, default='rerun'))
    assert [(s.tool_call_id, s.how) for s in done.settled] == [('w1', 'rerun')]


def test_a_default_recovery_policy_is_checked() -> None:
    for bad in ('sometimes', 3):
        with pytest.raises(ValueError, match='is no recovery policy'):
            StepPersistence(default_recovery_policy=bad)


async def test_an_outcome_says_when_its_claim_was_made_and_what_lease_it_took_over() -> None:
    store = InMemoryStepStore()
    world = World()
    await _orphan(store, world, 'claimed')
    found = await store.get_lease('claimed')
    assert found is not None
    await asyncio.sleep(TTL + 0.05)  # expired
    world.gate('claimed').set()
    (outcome,) = await recover_orphans(store, [world.agent(store)], lease_ttl=TTL)
    assert outcome.outcome == 'resumed'
    assert outcome.lease is not None
    assert (outcome.lease.epoch, outcome.lease.owner) == (found.epoch, found.owner)
    after = await store.get_lease('claimed')
    assert after is not None
    (taken,) = [change for change in after.history if change.what.value == 'taken over']
    assert outcome.claimed_at == taken.at  # the claim itself, not the end of the settlement after it
    assert outcome.listed_at is not None
    assert taken.at is not None
    assert outcome.listed_at <= taken.at  # listed by this worker, then claimed


async def test_the_loop_knows_when_it_first_listed_each_orphan_without_opentelemetry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A suspect's wait, and an outcome's `listed_at`, are the loop's own: they do not depend on the
    OpenTelemetry API being installed."""
    from stepcore.common import telemetry

    monkeypatch.setattr(telemetry, 'otel_api', False)
    store = InMemoryStepStore()
    world = World()
    await _orphan(store, world, 'listed')
    world.gate('listed').set()
    async with recovering(store, world) as outcomes:
        outcome = await outcomes.until('listed')
    assert outcome.listed_at is not None
    assert outcome.claimed_at is not None
    assert outcome.listed_at <= outcome.claimed_at


async def test_a_live_run_whose_renewal_came_late_is_not_an_orphan_to_its_own_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A starved event loop lets a live run's lease expire: another process may take the run over
    (and fences this one), but this process's own loop does not claim the run it is still running."""
    from stepcore.ownership.keeper import LeaseKeeper

    async def late(self: LeaseKeeper) -> bool:
        await asyncio.sleep(3600)  # the renewal never comes back in time
        return True

    monkeypatch.setattr(LeaseKeeper, 'renew', late)
    store = InMemoryStepStore()
    world = World()
    world.gate('live')
    run = asyncio.create_task(world.agent(store, 'live').run('go'))
    await asyncio.wait_for(world.entered('live').wait(), 5)
    await asyncio.sleep(TTL * 2)
    lease = await store.get_lease('live')
    assert lease is not None
    assert lease.state is LeaseState.RUNNING
    assert lease.expired  # any other process lists it as an orphan
    assert await list_orphans(store) == []  # this one knows it is alive here
    outcomes = Outcomes()
    stop = asyncio.Event()
    loop = asyncio.create_task(
        run_recovery_loop(store, [world.agent(store)], interval=0.05, stop=stop, on_outcome=outcomes.add)
    )
    await asyncio.sleep(0.3)  # six ticks
    world.gate('live').set()
    assert (await asyncio.wait_for(run, 5)).output == 'done'
    stop.set()
    await asyncio.wait_for(loop, 5)
    assert list(outcomes) == []
    ended = await store.get_lease('live')
    assert ended is not None
    assert (ended.state, ended.epoch) == (LeaseState.ENDED, lease.epoch)  # never taken over


async def _died_resumption(store: InMemoryStepStore, world: World, run_id: str) -> str:
    """`run_id` orphaned, then resumed, and that resumption stopped inside its tool in turn: the
    resumption's id (an orphan that is a suspect)."""
    await _orphan(store, world, run_id)
    resumption = await resolve_run(store, run_id=run_id, agent=world.agent(store), lease_ttl=TTL)
    await _stopped_inside_its_tool(world, run_id, resumption.run(world.agent(store)))
    lease = await store.get_lease(run_id)
    assert lease is not None
    assert lease.resumed_by is not None
    return lease.resumed_by


async def test_a_suspect_is_resumed_alone_in_its_worker() -> None:
    """A resumption that died may be what kills its worker: the loop resumes it with nothing beside
    it, and starts the next orphan only once it is done (here with room for two)."""
    store = InMemoryStepStore()
    world = World()
    resumption = await _died_resumption(store, world, 'suspect')
    await _orphan(store, world, 'plain')
    listed = {o.run_id: o for o in await list_orphans(store)}
    assert suspect(listed[resumption])
    assert not suspect(listed['plain'])
    async with recovering(store, world, concurrency=2) as outcomes:
        try:
            await asyncio.wait_for(world.entered('suspect').wait(), 10)  # the oldest orphan: alone
            await asyncio.sleep(0.3)  # six ticks with room for one more
            assert not world.entered('plain').is_set()
            world.gate('suspect').set()
            assert (await outcomes.until(resumption)).outcome == 'resumed'
            await asyncio.wait_for(world.entered('plain').wait(), 10)  # then the next
            world.gate('plain').set()
            assert (await outcomes.until('plain')).outcome == 'resumed'
        finally:
            world.gate('suspect').set()
            world.gate('plain').set()


async def test_a_suspect_waits_for_its_worker_to_drain_and_nothing_starts_beside_it() -> None:
    """An ordinary orphan runs; a suspect listed meanwhile is held until the worker is empty, and the
    worker takes nothing new while the suspect waits past one interval."""
    store = InMemoryStepStore()
    world = World()
    await _orphan(store, world, 'first')
    async with recovering(store, world, concurrency=3) as outcomes:
        try:
            await asyncio.wait_for(world.entered('first').wait(), 10)
            resumption = await _died_resumption(store, world, 'suspect')
            await asyncio.sleep(0.2)  # the suspect is listed, and waits past an interval
            await _orphan(store, world, 'later')
            await asyncio.sleep(0.3)
            assert not world.entered('suspect').is_set()  # not beside the first
            assert not world.entered('later').is_set()  # and the worker drains for the suspect
            world.gate('first').set()
            await asyncio.wait_for(world.entered('suspect').wait(), 10)
            await asyncio.sleep(0.2)
            assert not world.entered('later').is_set()  # nothing beside the suspect
            world.gate('suspect').set()
            assert (await outcomes.until(resumption)).outcome == 'resumed'
            await asyncio.wait_for(world.entered('later').wait(), 10)
            world.gate('later').set()
            assert (await outcomes.until('later')).outcome == 'resumed'
        finally:
            for gate in ('first', 'suspect', 'later'):
                world.gate(gate).set()


async def test_letting_go_of_a_claim_taken_over_meanwhile_is_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A worker stopped past its claim's lease comes back to a run another worker took: letting go
    of its claim finds nothing to let go, which is told at info level, not as a warning."""
    from stepcore.ownership.claims import claim_run
    from stepcore.recovery.claiming import release_quietly

    store = InMemoryStepStore()
    world = World()
    await _orphan(store, world, 'taken')
    first = await claim_run(store, 'taken', ttl=TTL)
    await claim_run(store, 'taken', ttl=TTL, force=True)  # another worker, after the first one's claim
    with caplog.at_level('INFO', logger='stepcore.recovery'):
        await release_quietly(first)
    assert not [r for r in caplog.records if r.levelname == 'WARNING']
    assert any('taken over meanwhile' in r.getMessage() for r in caplog.records)
