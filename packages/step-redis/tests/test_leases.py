"""Run leases in Redis: the keys and the state index, the server's clock, the fence inside COMMIT."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from redis.asyncio import Redis

from step_redis import RedisStepStore
from step_redis.store import RedisPort
from stepcore import EventKind, RunRecord, StepEvent
from stepcore.engine import DamagedRecordError
from stepcore.ownership import open_lease
from stepcore.ownership.claims import lease_template
from stepcore.store.leases import Fence, LeaseState, Owner, RunFencedError, fencing

T0 = datetime(2026, 1, 1, tzinfo=UTC)
START: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('start here', timestamp=T0)])]


@pytest.fixture
async def store(redis_url: str, key_prefix: str) -> AsyncIterator[RedisStepStore]:
    s = RedisStepStore(url=redis_url, key_prefix=key_prefix)
    yield s
    await s.aclose()


def _stranger() -> Owner:
    return Owner(host='another-host.invalid', pid=4242, token='t-stranger')


def _event(run_id: str, n: int) -> StepEvent:
    return StepEvent(run_id=run_id, kind=EventKind.MODEL_REQUEST_STARTED, step_index=n, timestamp=T0)


async def _server_now(client: Redis) -> float:
    seconds, micros = await client.time()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return int(seconds) + int(micros) / 1_000_000  # pyright: ignore[reportUnknownArgumentType]


async def _index(client: Redis, store: RedisStepStore, state: str) -> dict[bytes, float]:
    found = await client.zrange(store.keys.leases(state), 0, -1, withscores=True)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return {member: score for member, score in found}  # pyright: ignore[reportUnknownVariableType]


async def test_a_lease_is_a_hash_filed_under_its_states_index(store: RedisStepStore, redis_client: Redis) -> None:
    run_id = 'leased:1'
    await store.register_run(RunRecord(run_id=run_id))
    lease = await open_lease(store, run_id, ttl=60.0, start=START)
    run = store.keys.run(run_id)
    stored: dict[bytes, bytes] = await redis_client.hgetall(run.lease)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType, reportGeneralTypeIssues]
    assert set(stored) == {b'epoch', b'state', b'host', b'expires', b'body'}
    assert (stored[b'epoch'], stored[b'state']) == (b'1', b'running')
    expires = int(stored[b'expires'])
    assert abs(expires / 1_000_000 - lease.expires_at.timestamp()) < 1e-6
    assert await redis_client.exists(run.leasestart) == 1
    assert await _index(redis_client, store, 'running') == {run_id.encode(): float(expires)}

    # a swap to another state moves the run to that state's index; 'ended' has none
    waiting = lease_template(run_id, epoch=2, state=LeaseState.WAITING, owner=None, origin=run_id)
    assert (await store.swap_lease(waiting, expect=1, ttl=0.0))[0]
    assert await _index(redis_client, store, 'running') == {}
    assert list(await _index(redis_client, store, 'waiting')) == [run_id.encode()]
    ended = lease_template(run_id, epoch=2, state=LeaseState.ENDED, owner=None, origin=run_id, outcome='completed')
    assert (await store.swap_lease(ended, expect=2, ttl=0.0))[0]
    for state in LeaseState:
        assert await _index(redis_client, store, state.value) == {}
    assert await store.lease_start(run_id) == START, 'a swap without a start point keeps the stored one'

    # deleting the run leaves nothing of its lease: no hash, no start point, no index entry
    await open_lease(store, 'leased:2', ttl=60.0)
    assert await store.delete_run('leased:2')
    assert await store.delete_run(run_id)
    left = {key async for key in redis_client.scan_iter(match=f'{store.key_prefix}:*')}  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    assert left == {f'{store.key_prefix}:runseq'.encode()}, 'only the counter that keeps ids from being reused'


async def test_every_time_is_the_servers(
    store: RedisStepStore, redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = time.time
    monkeypatch.setattr(time, 'time', lambda: real() - 365 * 86400)  # this process's clock is a year behind
    run_id = 'clock'
    lease = await open_lease(store, run_id, ttl=60.0, owner=_stranger())
    server = await _server_now(redis_client)
    assert abs(lease.checked_at.timestamp() - server) < 30
    assert 59 < lease.seconds_left <= 60
    read = await store.get_lease(run_id)
    assert read is not None
    assert not read.expired
    assert abs(read.checked_at.timestamp() - server) < 30
    (listed,) = await store.list_leases([LeaseState.RUNNING])
    assert abs(listed.checked_at.timestamp() - server) < 30
    taker = lease_template(run_id, epoch=2, state=LeaseState.RUNNING, owner=_stranger(), origin=run_id)
    swapped, now = await store.swap_lease(taker, expect=1, expired=True, ttl=60.0)
    assert not swapped, 'a lease live on the server does not match an expired one'
    assert now is not None
    assert now.epoch == 1
    # and one that expired on the server's clock matches, whatever this process's clock says
    other = 'clock-expired'
    await open_lease(store, other, ttl=0.0, owner=_stranger())
    await asyncio.sleep(0.01)
    taker = lease_template(other, epoch=2, state=LeaseState.RUNNING, owner=_stranger(), origin=other)
    assert (await store.swap_lease(taker, expect=1, expired=True, ttl=60.0))[0]


async def test_the_fence_is_part_of_the_commit(store: RedisStepStore, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = 'fenced'
    await store.register_run(RunRecord(run_id=run_id))
    await open_lease(store, run_id, ttl=60.0, owner=_stranger())
    port = store.port
    assert isinstance(port, RedisPort)
    calls: list[Any] = []
    script = port._script  # pyright: ignore[reportPrivateUsage]

    async def counted(which: Any, keys: Any, args: Any) -> Any:
        calls.append(which)
        return await script(which, keys, args)

    monkeypatch.setattr(port, '_script', counted)
    with fencing(Fence(run_id, 1)):
        await store.append_event(_event(run_id, 1))
    assert calls == [port._commit], 'a fenced write is one COMMIT, with no round trip of its own'  # pyright: ignore[reportPrivateUsage]

    taker = lease_template(run_id, epoch=2, state=LeaseState.RUNNING, owner=_stranger(), origin=run_id)
    assert (await store.swap_lease(taker, expect=1, ttl=60.0))[0]
    calls.clear()
    with fencing(Fence(run_id, 1)), pytest.raises(RunFencedError) as refused:
        await store.write_batch([_event(run_id, 2)], snapshot=None)
    assert refused.value.lease is not None
    assert refused.value.lease.epoch == 2
    assert calls[0] == port._commit  # pyright: ignore[reportPrivateUsage]
    with fencing(Fence(run_id, 2)):
        await store.append_event(_event(run_id, 3))
    assert [e.step_index for e in await store.list_events(run_id)] == [1, 3]
    with fencing(Fence('no-lease', 1)), pytest.raises(RunFencedError):
        await store.append_event(_event('no-lease', 1))
    assert await store.list_events('no-lease') == []


async def test_a_damaged_lease_is_reported_and_left_out_of_listings(
    store: RedisStepStore, redis_client: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await open_lease(store, 'good', ttl=60.0, owner=_stranger())
    await open_lease(store, 'bad', ttl=60.0, owner=_stranger())
    await redis_client.hset(store.keys.run('bad').lease, 'epoch', 'one')  # pyright: ignore[reportUnknownMemberType, reportGeneralTypeIssues]
    with pytest.raises(DamagedRecordError, match='epoch'):
        await store.get_lease('bad')
    with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
        assert [x.run_id for x in await store.list_leases([LeaseState.RUNNING])] == ['good']
    assert 'bad' in caplog.text
    assert await store.delete_run('bad')
    assert await store.get_lease('bad') is None


async def test_a_ttl_that_is_not_finite_is_refused(store: RedisStepStore) -> None:
    lease = lease_template('forever', epoch=1, state=LeaseState.RUNNING, owner=_stranger(), origin='forever')
    with pytest.raises(ValueError, match='finite'):
        await store.swap_lease(lease, expect=None, ttl=float('inf'))
    assert await store.get_lease('forever') is None
