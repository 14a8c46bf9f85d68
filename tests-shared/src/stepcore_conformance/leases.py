"""The leases section: run ownership on the store (feature `leases`, see `stepcore.store.leases`).

For a store that declares `leases`:

- a lease is stored and read back with the store's clock, with its start point, and listed by state;
- a swap matches only the lease it expects (none, an epoch, an expired one);
- a live lease refuses a claim (a process on this host that is alive owns it); `force` takes it;
- an expired lease is claimable, and the claim fences the old epoch;
- of concurrent claimers exactly one wins: tasks on store objects of their own, and, for a
  `persistent` store, processes;
- a fenced writer's writes (events, ledger entries, snapshots, batches) are refused and invisible,
  and a write racing a takeover is either visible to the new owner at once or refused;
- a real agent run keeps its lease through a tool call three times its lease's time to live (async
  and sync tools) and releases it when it ends;
- deleting a run deletes its lease, and orphans are found through the index of states;
- a lease keeps the version the run's chain was started by, and a resumption's lease carries it;
- a job id submitted twice at once, through two store objects, is run once, and both submissions
  learn how it ended;
- each resumption of a chain that died is kept in the lease and carried on; a run whose resumptions
  died too often is set `dead` by `resolve_run(max_recovery_attempts=...)`, listed as such and never
  an orphan, until `retry_run` gives it another chance;
- a lease keeps its run's ownership history (taken, taken over from whom, released, handed to its
  resumption) and the writes it refused, which its owner's later swaps keep;
- a cancelled run (`cancel_run`) ends at once when nobody runs it, stops its live owner at its next
  write (and at its tool's `check_fencing_token`), records who cancelled it and why, and is never
  claimed, resumed or answered again.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

import stepcore
from stepcore import (
    EventKind,
    LeaseState,
    RunCancelledError,
    RunClaimedError,
    RunDeadError,
    RunFencedError,
    RunOwnedError,
    RunRecord,
    StepEvent,
    StepPersistence,
    StepStore,
    ToolEffectRecord,
    ToolEffectStatus,
    cancel_run,
    check_fencing_token,
    list_dead,
    list_orphans,
    resolve_run,
    retry_run,
    start_job,
)
from stepcore.backend import (
    LEASES,
    PERSISTENT,
    Fence,
    Owner,
    claim_run,
    fencing,
    lease_template,
    new_owner,
    open_lease,
    owner_gone,
    utcnow,
)

from ._support import StoreFixtures, at, conversation, needs_feature, new_id, other_store, snapshot
from .capability import function_model, script, tool_call

__all__ = ('LeasesConformance', 'claim_child_main')

_FAR_HOST = 'another-host.invalid'


def _stranger() -> Owner:
    """An owner on another host: only the lease's expiry tells whether it is gone."""
    return Owner(host=_FAR_HOST, pid=4242, token=new_id('token'), boot=None)


async def _registered(store: StepStore) -> str:
    run_id = new_id('leased')
    await store.register_run(RunRecord(run_id=run_id, started_at=at(0)))
    return run_id


async def _expired_lease(store: StepStore, run_id: str, *, owner: Owner | None = None) -> None:
    """Give the run a lease held by `owner` (another host's by default) that has already expired."""
    await open_lease(store, run_id, ttl=0.0, owner=owner or _stranger())
    await asyncio.sleep(0.01)


def _event(run_id: str, n: int) -> StepEvent:
    return StepEvent(run_id=run_id, kind=EventKind.MODEL_REQUEST_STARTED, step_index=n, timestamp=at(n))


def _effect(run_id: str, call: str) -> ToolEffectRecord:
    return ToolEffectRecord(
        run_id=run_id, tool_call_id=call, tool_name='lookup', status=ToolEffectStatus.STARTED, started_at=at(1)
    )


class LeasesConformance(StoreFixtures):
    """Run ownership on the store: leases, claims, fencing, renewal and orphans (feature `leases`)."""

    @needs_feature(LEASES)
    async def test_a_new_lease_is_held_and_read_back(self, store: StepStore) -> None:
        run_id = await _registered(store)
        start: list[ModelMessage] = [*conversation(2), ModelRequest(parts=[UserPromptPart('go on', timestamp=at(9))])]
        before = utcnow()
        lease = await open_lease(store, run_id, ttl=60.0, start=start)
        after = utcnow()
        assert (lease.run_id, lease.epoch, lease.state, lease.origin) == (run_id, 1, LeaseState.RUNNING, run_id)
        assert lease.owner is not None
        assert not owner_gone(lease)
        assert 55 < lease.seconds_left <= 60.0
        # the store's clock: here every process runs on one machine, so it is close to ours
        assert abs((lease.checked_at - before).total_seconds()) < 30
        assert abs((lease.checked_at - after).total_seconds()) < 30
        read = await store.get_lease(run_id)
        assert read is not None
        assert (read.epoch, read.state, read.owner, read.origin) == (1, LeaseState.RUNNING, lease.owner, run_id)
        assert abs((read.expires_at - lease.expires_at).total_seconds()) < 0.001
        assert not read.expired
        assert await store.lease_start(run_id) == start
        assert run_id in {x.run_id for x in await store.list_leases([LeaseState.RUNNING])}
        assert run_id not in {x.run_id for x in await store.list_leases([LeaseState.WAITING, LeaseState.PENDING])}
        assert await store.get_lease(new_id('none')) is None
        assert await store.lease_start(new_id('none')) is None

    @needs_feature(LEASES)
    async def test_a_swap_matches_only_the_lease_it_expects(self, store: StepStore) -> None:
        run_id = await _registered(store)
        first = await open_lease(store, run_id, ttl=60.0)
        with pytest.raises(RunClaimedError, match=run_id):
            await open_lease(store, run_id, ttl=60.0)  # it has one
        other = lease_template(run_id, epoch=5, state=LeaseState.RUNNING, owner=_stranger(), origin=run_id)
        swapped, now = await store.swap_lease(other, expect=first.epoch + 1, ttl=60.0)
        assert not swapped
        assert now is not None
        assert now.epoch == first.epoch
        swapped, now = await store.swap_lease(other, expect=first.epoch, expired=True, ttl=60.0)
        assert not swapped, 'a live lease does not match a swap that expects an expired one'
        assert now is not None
        assert now.owner == first.owner
        swapped, now = await store.swap_lease(other, expect=first.epoch, ttl=60.0)
        assert swapped
        assert now is not None
        assert (now.epoch, now.owner) == (5, other.owner)
        assert await store.lease_start(run_id) is None, 'no start point was stored'

    @needs_feature(LEASES)
    async def test_a_live_lease_refuses_a_claim_and_force_takes_it(self, store: StepStore) -> None:
        run_id = await _registered(store)
        await open_lease(store, run_id, ttl=60.0)  # this process: alive, on this host
        with pytest.raises(RunOwnedError, match='would act on a live run'):
            await claim_run(store, run_id, ttl=60.0)
        stranger = await _registered(store)
        await open_lease(store, stranger, ttl=60.0, owner=_stranger())  # another host: its expiry decides
        with pytest.raises(RunOwnedError, match=_FAR_HOST):
            await claim_run(store, stranger, ttl=60.0)
        claim = await claim_run(store, stranger, ttl=60.0, force=True)
        assert claim.epoch == 2
        lease = await store.get_lease(stranger)
        assert lease is not None
        assert (lease.epoch, lease.owner) == (2, claim.lease.owner)

    @needs_feature(LEASES)
    async def test_an_expired_lease_is_claimable_and_fences_the_old_epoch(self, store: StepStore) -> None:
        run_id = await _registered(store)
        await _expired_lease(store, run_id)
        (orphan,) = [o for o in await list_orphans(store) if o.run_id == run_id]
        assert orphan.why == 'lease expired'
        claim = await claim_run(store, run_id, ttl=60.0)
        assert (claim.epoch, claim.previous.epoch if claim.previous else None) == (2, 1)
        assert run_id not in {o.run_id for o in await list_orphans(store)}
        with fencing(Fence(run_id, 1)), pytest.raises(RunFencedError, match='taken over'):
            await store.append_event(_event(run_id, 1))
        with fencing(Fence(run_id, claim.epoch)):
            await store.append_event(_event(run_id, 2))
        assert [e.step_index for e in await store.list_events(run_id)] == [2]
        # a dead owner on this host is seen at once, before its lease expires
        gone = await _registered(store)
        ghost = replace(new_owner(), pid=2**22 + 12345)
        await open_lease(store, gone, ttl=600.0, owner=ghost)
        assert [o.why for o in await list_orphans(store) if o.run_id == gone] == ['owner gone']
        assert (await claim_run(store, gone, ttl=60.0)).epoch == 2

    @needs_feature(LEASES)
    async def test_concurrent_claimers_exactly_one_wins(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        run_id = await _registered(store)
        await _expired_lease(store, run_id)
        stores = [store]
        async with other_store(store, store_spec) as second, other_store(store, store_spec) as third:
            stores += [second, third]

            async def attempt(n: int) -> str:
                try:
                    claim = await claim_run(stores[n % len(stores)], run_id, ttl=60.0)
                except (RunClaimedError, RunOwnedError):
                    return 'lost'
                return f'won {claim.epoch} {claim.lease.owner.token if claim.lease.owner else ""}'

            outcomes = await asyncio.gather(*(attempt(n) for n in range(12)))
        winners = [o for o in outcomes if o.startswith('won')]
        assert len(winners) == 1, outcomes
        lease = await store.get_lease(run_id)
        assert lease is not None
        assert lease.owner is not None
        assert winners[0] == f'won 2 {lease.owner.token}'

    @needs_feature(PERSISTENT, LEASES)
    async def test_claimers_in_other_processes_exactly_one_wins(
        self, store: StepStore, store_spec: dict[str, Any] | None, tmp_path: Path
    ) -> None:
        assert store_spec is not None
        run_id = await _registered(store)
        await _expired_lease(store, run_id)
        go = tmp_path / 'go'
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                '-c',
                'from stepcore_conformance.leases import claim_child_main; claim_child_main()',
                json.dumps(
                    {'spec': store_spec, 'run_id': run_id, 'ready': str(tmp_path / f'ready-{n}'), 'go': str(go)}
                ),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for n in range(4)
        ]
        deadline = time.monotonic() + 120
        while not all((tmp_path / f'ready-{n}').exists() for n in range(4)):
            assert time.monotonic() < deadline, 'the claiming processes never got ready'
            await asyncio.sleep(0.05)
        go.touch()
        outputs = [await child.communicate() for child in children]
        results = [out.decode().strip() for out, _ in outputs]
        errors = [err.decode()[-1500:] for _, err in outputs if err.strip()]
        assert all(child.returncode == 0 for child in children), errors
        assert sorted(r.split()[0] for r in results) == ['lost', 'lost', 'lost', 'won'], results
        lease = await store.get_lease(run_id)
        assert lease is not None
        assert lease.owner is not None
        assert lease.epoch == 2
        assert f'won {lease.owner.token}' in results

    @needs_feature(LEASES)
    async def test_a_fenced_writers_writes_are_refused_and_invisible(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        run_id = await _registered(store)
        first = await open_lease(store, run_id, ttl=0.0, owner=_stranger())
        zombie = Fence(run_id, first.epoch)
        with fencing(zombie):
            await store.append_event(_event(run_id, 1))
            await store.save_snapshot(snapshot(run_id, conversation(1), step_index=1))
        await asyncio.sleep(0.01)
        async with other_store(store, store_spec) as other:
            claim = await claim_run(other, run_id, ttl=60.0)
            writes: list[Any] = [
                store.append_event(_event(run_id, 2)),
                store.record_tool_effect(_effect(run_id, 'late')),
                store.save_snapshot(snapshot(run_id, conversation(3), step_index=3)),
                store.write_batch(
                    [_event(run_id, 3), _effect(run_id, 'later')], snapshot=snapshot(run_id, conversation(4))
                ),
            ]
            for write in writes:
                with fencing(zombie), pytest.raises(RunFencedError) as refused:
                    await write
                assert refused.value.run_id == run_id
                assert refused.value.lease is not None
                assert refused.value.lease.epoch == claim.epoch
            for reader in (store, other):
                assert [e.step_index for e in await reader.list_events(run_id)] == [1]
                assert await reader.list_tool_effects(run_id) == []
                assert [s.step_index for s in await reader.list_snapshots(run_id, include_interrupted=True)] == [1]
            with fencing(Fence(run_id, claim.epoch)):
                await other.append_event(_event(run_id, 5))
            assert [e.step_index for e in await store.list_events(run_id)] == [1, 5]

    @needs_feature(LEASES)
    async def test_the_lease_keeps_who_held_the_run_and_the_writes_it_refused(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        run_id = await _registered(store)
        first = await open_lease(store, run_id, ttl=0.0, owner=_stranger())
        await asyncio.sleep(0.01)
        async with other_store(store, store_spec) as other:
            claim = await claim_run(other, run_id, ttl=60.0)
            with fencing(Fence(run_id, first.epoch)), pytest.raises(RunFencedError):
                await store.append_event(_event(run_id, 1))
            with fencing(Fence(run_id, first.epoch)), pytest.raises(RunFencedError):
                await store.append_event(_event(run_id, 2))  # refused again: noted once
            noted = await store.get_lease(run_id)
            assert noted is not None
            assert (noted.epoch, noted.state, noted.owner) == (claim.epoch, LeaseState.RUNNING, claim.lease.owner)
            assert abs((noted.expires_at - claim.lease.expires_at).total_seconds()) < 1.0, 'the note keeps the hold'
            await claim.renew()  # built from the lease as the claim read it: the note is kept
            await claim.release(state=LeaseState.PENDING, note='a person decides')
        lease = await store.get_lease(run_id)
        assert lease is not None
        steps = [(c.what.value, c.epoch, c.state) for c in lease.history]
        assert steps == [
            ('taken', 1, 'running'),
            ('taken over', 2, 'running'),
            ('refused', 1, 'running'),
            ('released', 2, 'pending'),
        ]
        taken, over, refused, released = lease.history
        assert _FAR_HOST in (taken.owner or '')
        assert f'{_FAR_HOST} pid 4242 at epoch 1' in (over.previous or '')
        assert 'lease expired' in (over.detail or '')
        assert 'recovering it' in (over.owner or '')
        assert refused.owner
        assert refused.detail == 'the run is at epoch 2'
        assert released.detail == 'a person decides'
        assert [c.at for c in lease.history] == sorted(c.at for c in lease.history)
        # a resumption's lease starts a history of its own, and the run shows the hand-over
        claim = await claim_run(store, run_id, ttl=60.0)
        resumption = new_id('resumption')
        mine = await claim.hand_over(resumption, ttl=60.0)
        assert [(c.what.value, c.detail) for c in mine.history] == [('taken', f'resumes run {run_id}')]
        handed = await store.get_lease(run_id)
        assert handed is not None
        assert [(c.what.value, c.detail) for c in handed.history[-2:]] == [
            ('taken over', 'it was pending'),
            ('resumed', resumption),
        ]

    @needs_feature(LEASES)
    async def test_a_write_racing_a_takeover_is_seen_by_the_new_owner_or_refused(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        run_id = await _registered(store)
        first = await open_lease(store, run_id, ttl=0.2, owner=_stranger())
        written: list[int] = []
        refused: list[int] = []

        async def zombie() -> None:
            # it writes until it is fenced (or 45 s passed): how fast a store writes never
            # decides whether the takeover comes before the writer stops
            deadline = time.monotonic() + 45
            with fencing(Fence(run_id, first.epoch)):
                n = 0
                while time.monotonic() < deadline:
                    n += 1
                    try:
                        await store.append_event(_event(run_id, n))
                    except RunFencedError:
                        refused.append(n)
                        return
                    written.append(n)
                    await asyncio.sleep(0)  # a store that writes without waiting lets the claimer in

        async with other_store(store, store_spec) as other:
            writer = asyncio.create_task(zombie())
            while True:
                try:
                    await claim_run(other, run_id, ttl=60.0)
                    break
                except RunOwnedError:
                    await asyncio.sleep(0.01)
            seen = {e.step_index for e in await other.list_events(run_id)}
            await asyncio.wait_for(writer, 60)
        assert refused, 'the writer was never fenced'
        assert set(written) <= seen, f'writes that succeeded after the takeover: {sorted(set(written) - seen)}'
        assert {e.step_index for e in await store.list_events(run_id)} == set(written)

    @needs_feature(LEASES)
    async def test_a_run_keeps_its_lease_through_a_tool_call_three_ttls_long(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        ttl = 0.6
        checks: list[str] = []
        run_id = new_id('long-tool')
        agent = Agent(
            function_model(
                script(
                    ModelResponse(parts=[tool_call('wait_async', 'c1')]),
                    ModelResponse(parts=[tool_call('wait_sync', 'c2')]),
                    ModelResponse(parts=[TextPart('done')]),
                )
            ),
            capabilities=[StepPersistence(store=store, run_id=run_id, lease_ttl=ttl)],
        )

        async def probe(other: StepStore) -> None:
            for _ in range(3):
                await asyncio.sleep(ttl)
                try:
                    await claim_run(other, run_id, ttl=60.0)
                    checks.append('claimed')
                except RunOwnedError:
                    checks.append('live')

        async with other_store(store, store_spec) as other:

            @agent.tool_plain
            async def wait_async() -> str:  # pyright: ignore[reportUnusedFunction]
                await probe(other)
                return 'waited'

            @agent.tool_plain
            def wait_sync() -> str:  # pyright: ignore[reportUnusedFunction]
                time.sleep(3 * ttl)
                return 'waited too'

            during_sync: list[Any] = []

            async def watch() -> None:
                for _ in range(1200):  # the sync tool call has started
                    if any(e.tool_call_id == 'c2' for e in await other.list_tool_effects(run_id)):
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(2 * ttl)
                during_sync.append(await other.get_lease(run_id))

            watcher = asyncio.create_task(watch())
            result = await agent.run('wait twice')
            await asyncio.wait_for(watcher, 30)
        assert result.output == 'done'
        assert checks == ['live', 'live', 'live'], 'the lease expired during the async tool call'
        (mid,) = during_sync
        assert mid is not None
        assert mid.state is LeaseState.RUNNING, mid
        assert not mid.expired, mid
        lease = await store.get_lease(run_id)
        assert lease is not None
        assert (lease.state, lease.outcome, lease.epoch) == (LeaseState.ENDED, 'completed', 1)
        assert run_id not in {o.run_id for o in await list_orphans(store)}

    @needs_feature(LEASES)
    async def test_a_failed_run_releases_its_lease(self, store: StepStore) -> None:
        run_id = new_id('failed')
        agent = Agent(
            function_model(script(ModelResponse(parts=[tool_call('boom', 'c1')]))),
            capabilities=[StepPersistence(store=store, run_id=run_id)],
        )

        @agent.tool_plain
        def boom() -> str:  # pyright: ignore[reportUnusedFunction]
            raise RuntimeError('boom')

        with pytest.raises(RuntimeError, match='boom'):
            await agent.run('fail')
        lease = await store.get_lease(run_id)
        assert lease is not None
        assert (lease.state, lease.outcome, lease.owner) == (LeaseState.ENDED, 'failed', None)

    @needs_feature(LEASES)
    async def test_deleting_a_run_deletes_its_lease(self, store: StepStore) -> None:
        run_id = await _registered(store)
        await open_lease(store, run_id, ttl=60.0, start=conversation(1))
        assert await store.delete_run(run_id)
        assert await store.get_lease(run_id) is None
        assert await store.lease_start(run_id) is None
        assert run_id not in {x.run_id for x in await store.list_leases([LeaseState.RUNNING])}

    @needs_feature(LEASES)
    async def test_orphans_are_found_through_the_states_index(self, store: StepStore) -> None:
        orphaned, waiting, ended = [await _registered(store) for _ in range(3)]
        await _expired_lease(store, orphaned)
        for run_id, state in ((waiting, LeaseState.WAITING), (ended, LeaseState.ENDED)):
            lease = lease_template(run_id, epoch=1, state=state, owner=None, origin=run_id, outcome='completed')
            swapped, _ = await store.swap_lease(lease, expect=None, ttl=0.0)
            assert swapped
        await asyncio.sleep(0.01)
        found = {o.run_id for o in await list_orphans(store)}
        assert orphaned in found
        assert waiting not in found
        assert ended not in found
        assert waiting in {x.run_id for x in await store.list_leases([LeaseState.WAITING])}
        with pytest.raises(ValueError, match='ended'):
            await store.list_leases([LeaseState.ENDED])

    @needs_feature(LEASES)
    async def test_a_version_is_kept_in_the_lease_and_carried_to_a_resumption(self, store: StepStore) -> None:
        run_id = await _registered(store)
        lease = await open_lease(store, run_id, ttl=0.0, owner=_stranger(), version='2026.12.1')
        assert lease.version == '2026.12.1'
        await asyncio.sleep(0.01)
        (found,) = [o for o in await list_orphans(store) if o.run_id == run_id]
        assert found.lease.version == '2026.12.1'
        claim = await claim_run(store, run_id, ttl=60.0)
        assert claim.lease.version == '2026.12.1'
        resumption = new_id('resumption')
        mine = await claim.hand_over(resumption, ttl=60.0, version='2027.1.0')
        assert mine.version == '2026.12.1'  # the chain's, not the resuming code's
        stored = await store.get_lease(resumption)
        assert stored is not None
        assert stored.version == '2026.12.1'
        unversioned = await _registered(store)
        assert (await open_lease(store, unversioned, ttl=60.0)).version is None

    # --- jobs ----------------------------------------------------------------------------------------

    @needs_feature(LEASES)
    async def test_a_job_submitted_twice_at_once_runs_once(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        job_id = new_id('job')
        ran: list[str] = []
        go = asyncio.Event()

        def agent_on(where: StepStore) -> Agent[None, str]:
            agent = Agent(
                function_model(
                    script(ModelResponse(parts=[tool_call('ship', 'c1')]), ModelResponse(parts=[TextPart('done')]))
                ),
                capabilities=[StepPersistence(store=where)],
            )

            @agent.tool_plain
            async def ship() -> str:  # pyright: ignore[reportUnusedFunction]
                ran.append(job_id)
                await go.wait()
                return 'shipped'

            return agent

        async with other_store(store, store_spec) as other:
            submissions = [
                asyncio.create_task(start_job(agent_on(where), 'ship it', job_id=job_id, poll=0.02))
                for where in (store, other)
            ]
            for _ in range(1000):
                if ran:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            go.set()
            results = await asyncio.wait_for(asyncio.gather(*submissions), 60)
        assert ran == [job_id]
        assert sorted(r.started for r in results) == [False, True]
        assert [(r.run_id, r.status) for r in results] == [(job_id, 'completed')] * 2
        assert [r.run_id for r in await store.list_runs() if r.run_id == job_id] == [job_id]

    # --- runs that kill their worker ------------------------------------------------------------------

    @needs_feature(LEASES)
    async def test_resumptions_that_died_are_counted_and_too_many_make_the_run_dead(self, store: StepStore) -> None:
        first = await _registered(store)
        await _expired_lease(store, first)
        chain = [first]
        for n in range(2):  # two resumptions, each of which dies (its lease expires on another host)
            claim = await claim_run(store, chain[-1], ttl=60.0)
            assert len(claim.lease.died) == n  # the first run's own death is no resumption's
            resumption = new_id('resumption')
            await claim.hand_over(resumption, ttl=0.0, owner=_stranger())
            chain.append(resumption)
            await asyncio.sleep(0.01)
        with pytest.raises(RunDeadError, match='2 resumptions of it died') as raised:
            await resolve_run(store, run_id=first, max_recovery_attempts=2)
        dead = raised.value.lease
        assert dead.run_id == chain[-1]
        assert [(a.run_id, a.why) for a in dead.died] == [(chain[1], 'lease expired'), (chain[2], 'lease expired')]
        assert all(a.owner.startswith(_FAR_HOST) for a in dead.died)
        stored = await store.get_lease(chain[-1])
        assert stored is not None
        assert (stored.state, len(stored.died)) == (LeaseState.DEAD, 2)
        assert [lease.run_id for lease in await list_dead(store)] == [chain[-1]]
        assert chain[-1] not in {o.run_id for o in await list_orphans(store)}
        # another chance: the deaths are forgotten and the run is an orphan again, at once
        retried = await retry_run(store, run_id=first)
        assert (retried.run_id, retried.state, retried.died) == (chain[-1], LeaseState.RUNNING, ())
        await asyncio.sleep(0.01)
        assert chain[-1] in {o.run_id for o in await list_orphans(store)}
        assert await list_dead(store) == []
        with pytest.raises(ValueError, match='is not dead'):
            await retry_run(store, run_id=first)

    # --- cancel ------------------------------------------------------------------------------------

    @needs_feature(LEASES)
    async def test_cancelling_an_orphan_ends_it_and_nothing_claims_it_again(self, store: StepStore) -> None:
        run_id = await _registered(store)
        await _expired_lease(store, run_id)
        assert run_id in {o.run_id for o in await list_orphans(store)}
        lease = await cancel_run(store, run_id=run_id, reason='customer withdrew the order', by='ops@example')
        assert (lease.state, lease.outcome, lease.owner) == (LeaseState.ENDED, 'cancelled', None)
        assert lease.note == 'cancelled by ops@example: customer withdrew the order'
        assert run_id not in {o.run_id for o in await list_orphans(store)}
        (event,) = [e for e in await store.list_events(run_id) if e.kind is EventKind.RUN_FAILED]
        assert event.error == 'cancelled by ops@example: customer withdrew the order'
        assert event.metadata['stepcore.cancelled_by'] == 'ops@example'
        for force in (False, True):
            with pytest.raises(RunCancelledError, match='customer withdrew the order'):
                await claim_run(store, run_id, ttl=60.0, force=force)
        # once is enough: a second cancel changes nothing
        again = await cancel_run(store, run_id=run_id, reason='twice', by='someone else')
        assert (again.epoch, again.note) == (lease.epoch, lease.note)
        assert len([e for e in await store.list_events(run_id) if e.kind is EventKind.RUN_FAILED]) == 1

    @needs_feature(LEASES)
    async def test_cancelling_a_running_run_stops_its_owner_at_its_next_write(self, store: StepStore) -> None:
        run_id = new_id('cancelled')
        in_tool, go_on = asyncio.Event(), asyncio.Event()
        checked: list[str] = []
        agent = Agent(
            function_model(
                script(ModelResponse(parts=[tool_call('slow', 'c1')]), ModelResponse(parts=[TextPart('done')]))
            ),
            capabilities=[StepPersistence(store=store, run_id=run_id, lease_ttl=30.0)],
        )

        @agent.tool_plain
        async def slow() -> str:  # pyright: ignore[reportUnusedFunction]
            in_tool.set()
            await go_on.wait()
            try:
                await check_fencing_token()  # before an irreversible act: is the run still ours?
            except RunFencedError as error:
                checked.append(str(error))
                raise
            return 'acted'

        running = asyncio.create_task(agent.run('work slowly'))
        await asyncio.wait_for(in_tool.wait(), 30)
        live = await store.get_lease(run_id)
        assert live is not None
        assert live.state is LeaseState.RUNNING
        lease = await cancel_run(store, run_id=run_id, reason='wrong customer', by='ops')
        assert lease.epoch > live.epoch
        go_on.set()
        with pytest.raises(RunFencedError, match='cancelled by ops: wrong customer'):
            await asyncio.wait_for(running, 30)
        assert len(checked) == 1
        assert 'cancelled by ops: wrong customer' in checked[0]
        after = await store.get_lease(run_id)
        assert after is not None
        assert (after.state, after.outcome, after.epoch) == (LeaseState.ENDED, 'cancelled', lease.epoch)
        kinds = [e.kind for e in await store.list_events(run_id)]
        assert kinds[-1] is EventKind.RUN_FAILED  # the cancel's; the owner wrote nothing after it
        assert EventKind.TOOL_CALL_FAILED not in kinds
        with pytest.raises(RunCancelledError):
            await resolve_run(store, run_id=run_id)

    @needs_feature(LEASES)
    async def test_cancel_refuses_a_run_that_already_ended_and_names_an_unknown_one(self, store: StepStore) -> None:
        run_id = new_id('done')
        agent = Agent(
            function_model(script(ModelResponse(parts=[TextPart('done')]))),
            capabilities=[StepPersistence(store=store, run_id=run_id)],
        )
        await agent.run('finish')
        with pytest.raises(ValueError, match='already ended \\(completed\\)'):
            await cancel_run(store, run_id=run_id, reason='too late')
        lease = await store.get_lease(run_id)
        assert lease is not None
        assert (lease.state, lease.outcome) == (LeaseState.ENDED, 'completed')
        with pytest.raises(LookupError, match='no such run'):
            await cancel_run(store, run_id=new_id('missing'), reason='nothing there')
        with pytest.raises(ValueError, match='needs a reason'):
            await cancel_run(store, run_id=run_id, reason='  ')


def claim_child_main() -> None:
    """Child process of the multi-process claim test: wait for the signal, claim, print the outcome."""
    config = json.loads(sys.argv[-1])

    async def main() -> None:
        store = cast(StepStore, stepcore.from_spec(**config['spec']))
        try:
            await store.list_runs(limit=1)  # connect before the race starts
            Path(config['ready']).touch()
            go = Path(config['go'])
            for _ in range(24_000):  # until every claimer is ready
                if go.exists():
                    break
                await asyncio.sleep(0.005)
            try:
                claim = await claim_run(store, config['run_id'], ttl=60.0)
            except (RunClaimedError, RunOwnedError) as error:
                print(f'lost {type(error).__name__}')
                return
            assert claim.lease.owner is not None
            print(f'won {claim.lease.owner.token}')
        finally:
            await store.aclose()

    asyncio.run(main())
