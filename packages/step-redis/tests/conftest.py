"""Fixtures for the step-redis tests: a real server reached by `STEP_REDIS_URL` only.

Without the variable, or with a server that does not answer, every test fails (never skips):
start one with `export STEP_REDIS_URL="$(scripts/redis-server.sh start)"`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis
from redis.asyncio import Redis

from step_redis.keys import pack, unpack
from step_redis.store import RedisStepStore
from stepcore import StepStore
from stepcore_conformance import Damage

START_HINT = 'start a server with: export STEP_REDIS_URL="$(scripts/redis-server.sh start)"'


@pytest.fixture(scope='session')
def redis_url() -> str:
    """The server URL from `STEP_REDIS_URL`, checked to answer."""
    url = os.environ.get('STEP_REDIS_URL', '').strip()
    if not url:
        pytest.fail(f'STEP_REDIS_URL is not set; the step-redis tests need a real server: {START_HINT}')
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=10) as client:
            client.ping()
    except redis.RedisError as exc:
        pytest.fail(f'cannot reach Redis at STEP_REDIS_URL={url}: {exc}; {START_HINT}')
    return url


def drop_prefix(url: str, prefix: str) -> None:
    """Delete every key named `<prefix>:*`."""
    with redis.Redis.from_url(url) as client:
        doomed = list(client.scan_iter(match=f'{prefix}:*', count=1000))
        for first in range(0, len(doomed), 1000):
            client.delete(*doomed[first : first + 1000])


@pytest.fixture
def new_prefix(redis_url: str) -> Iterator[Callable[[], str]]:
    """Makes fresh key prefixes for one test; their keys are deleted afterwards."""
    made: list[str] = []

    def make() -> str:
        made.append(f't_{uuid.uuid4().hex[:16]}')
        return made[-1]

    yield make
    for prefix in made:
        drop_prefix(redis_url, prefix)


@pytest.fixture
def key_prefix(new_prefix: Callable[[], str]) -> str:
    """A fresh key prefix for one test; its keys are deleted afterwards."""
    return new_prefix()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Redis]:
    """A client of the test's own, to look at (or spoil) what a store wrote."""
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def damage_record(
    client: Redis, store: StepStore, kind: str, run_id: str, ident: int | str | None, replacement: bytes
) -> None:
    """Overwrite the stored body of one record (every message holding the marker text, for
    `kind='message'`) with `replacement`, keeping the row's other fields."""
    assert isinstance(store, RedisStepStore)
    keys = store.keys
    run = keys.run(run_id)
    if kind == 'message':
        nodes: dict[bytes, bytes] = await client.hgetall(run.node)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        hit = {node: value for node, value in nodes.items() if str(ident).encode() in value}
        assert hit, f'no stored message of run {run_id!r} holds {ident!r}'
        for node, value in hit.items():
            await client.hset(run.node, node, pack(unpack(value, 2)[0], replacement))  # pyright: ignore[reportUnknownMemberType]
        return
    if kind == 'event':
        assert isinstance(ident, int)
        value = await client.lindex(run.ev, ident - 1)  # pyright: ignore[reportUnknownMemberType]
        assert value is not None, f'no event seq={ident} of run {run_id!r}'
        fields = unpack(value, 2)  # pyright: ignore[reportUnknownArgumentType]
        await client.lset(run.ev, ident - 1, pack(*fields[:-1], replacement))  # pyright: ignore[reportUnknownMemberType]
        return
    key, field, count = {
        'run': (keys.runs, run_id, 4),
        'effect': (run.fx, ident, 3),
        'snapshot': (run.snap, ident, 4),
    }[kind]
    assert field is not None
    value = await client.hget(key, field)  # pyright: ignore[reportUnknownMemberType]
    assert value is not None, f'no stored {kind} {ident!r} of run {run_id!r}'
    fields = unpack(value, count)  # pyright: ignore[reportUnknownArgumentType]
    await client.hset(key, field, pack(*fields[:-1], replacement))  # pyright: ignore[reportUnknownMemberType]


@pytest.fixture
def redis_damage(redis_client: Redis) -> Damage:
    """The conformance kit's damage hook for `RedisStepStore` (see `damage_record`)."""

    async def damage(store: StepStore, kind: str, run_id: str, ident: int | str | None, replacement: bytes) -> None:
        await damage_record(redis_client, store, kind, run_id, ident, replacement)

    return damage
