"""RedisStepStore behaviour specific to Redis, against a real server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis.asyncio import Redis

import stepcore
from step_redis import RedisMediaStore, RedisStepStore
from step_redis.plugin import redis_url_options
from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    StepEvent,
    StepPersistence,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.engine.faults import inject_faults
from stepcore_conformance.support import check_tool_steps, write_tool_steps

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
async def store(redis_url: str, key_prefix: str) -> AsyncIterator[RedisStepStore]:
    s = RedisStepStore(url=redis_url, key_prefix=key_prefix)
    yield s
    await s.aclose()


def _exchange(i: int) -> list[ModelMessage]:
    call = f'call-{i}'
    return [
        ModelResponse(parts=[ToolCallPart('lookup', {'i': i}, tool_call_id=call)], timestamp=T0),
        ModelRequest(parts=[ToolReturnPart('lookup', f'result {i}', tool_call_id=call, timestamp=T0)]),
    ]


def _history(steps: int, tag: str = 'run') -> list[ModelMessage]:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(f'{tag}: start', timestamp=T0)])]
    for i in range(steps):
        messages += _exchange(i)
    return messages


async def _prefix_keys(client: Redis, prefix: str) -> set[bytes]:
    return {key async for key in client.scan_iter(match=f'{prefix}:*', count=1000)}


def _in_another_process_like_writer(work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `work()` to the end on an event loop of its own, in another thread, and wait for it.

    Called from a fault hook, it plays another writer acting between this store's checks and its
    commit (the hook blocks this store's event loop meanwhile).
    """
    failures: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(work())
        except BaseException as error:  # reported to the test below
            failures.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if failures:
        raise failures[0]


# -- options and connections -------------------------------------------------------------------


@pytest.mark.parametrize('prefix', ['', 'app:runs', 'x' * 65, 'a b', 7])
def test_a_bad_key_prefix_is_refused_naming_it(prefix: Any) -> None:
    with pytest.raises(ValueError, match=r'key_prefix=.* cannot be used: use 1-64 of A-Z a-z 0-9 _ \. -'):
        RedisStepStore(url='redis://127.0.0.1:1/0', key_prefix=prefix)
    with pytest.raises(ValueError, match='key_prefix='):
        RedisMediaStore(url='redis://127.0.0.1:1/0', key_prefix=prefix)


async def test_connection_options_are_checked(redis_url: str, redis_client: Redis) -> None:
    with pytest.raises(ValueError, match='takes client= or url=, not both'):
        RedisStepStore(url=redis_url, client=redis_client)
    with pytest.raises(ValueError, match=r'needs url= \(a Redis URL'):
        RedisStepStore()
    with pytest.raises(ValueError, match=r"got url='postgresql://h/db': expected a 'redis://'"):
        RedisStepStore(url='postgresql://h/db')
    with pytest.raises(TypeError, match=r'needs a redis\.asyncio\.Redis as client='):
        RedisStepStore(client=object())  # pyright: ignore[reportArgumentType]
    text_client = Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ValueError, match='without decode_responses=True'):
            RedisStepStore(client=text_client)
    finally:
        await text_client.aclose()


async def test_a_shared_client_stays_open_and_an_own_one_is_closed(
    redis_url: str, key_prefix: str, redis_client: Redis
) -> None:
    shared = RedisStepStore(client=redis_client, key_prefix=key_prefix)
    await shared.register_run(RunRecord(run_id='shared'))
    await shared.aclose()
    assert await redis_client.ping()  # pyright: ignore[reportUnknownMemberType, reportGeneralTypeIssues]
    async with RedisStepStore(url=redis_url, key_prefix=key_prefix) as own:
        assert [r.run_id for r in await own.list_runs()] == ['shared']
        assert isinstance(own.media_store, RedisMediaStore)
        assert own.media_store.client is own.client


async def test_errors_of_an_unreachable_server_name_the_store(key_prefix: str) -> None:
    store = RedisStepStore(url='redis://127.0.0.1:1/0', key_prefix=key_prefix)
    try:
        with pytest.raises(redis.ConnectionError, match=r'127\.0\.0\.1:1') as raised:
            await store.get_run('r')
        notes = getattr(raised.value, '__notes__', [])
        assert any(f"RedisStepStore on Redis keys '{key_prefix}:*' in database 0 at 127.0.0.1:1" in n for n in notes)
    finally:
        await store.aclose()


# -- URLs and specs ----------------------------------------------------------------------------


def test_url_options_split_the_store_options_from_the_client_ones() -> None:
    assert redis_url_options('redis://:secret@cache:6379/2?key_prefix=app&socket_timeout=5') == {
        'url': 'redis://:secret@cache:6379/2?socket_timeout=5',
        'key_prefix': 'app',
    }
    assert redis_url_options(' rediss://cache:6380 ') == {'url': 'rediss://cache:6380'}
    assert redis_url_options('redis://h/0?max_snapshots_per_run=3&media_threshold_bytes=10&media_store=auto') == {
        'url': 'redis://h/0',
        'max_snapshots_per_run': '3',
        'media_threshold_bytes': '10',
        'media_store': 'auto',
    }
    with pytest.raises(ValueError, match=r"names database 'agents': a Redis database is a number"):
        redis_url_options('redis://h:6379/agents')
    with pytest.raises(ValueError, match="gives option 'key_prefix' twice"):
        redis_url_options('redis://h/0?key_prefix=a&key_prefix=b')


async def test_open_store_and_from_spec_build_the_redis_backends(redis_url: str, key_prefix: str) -> None:
    store = stepcore.open_store(f'{redis_url}?key_prefix={key_prefix}&max_snapshots_per_run=2&media_store=auto')
    spec_store = stepcore.from_spec('redis', url=redis_url, key_prefix=key_prefix, media_store='auto')
    media = stepcore.media_from_spec('redis', url=redis_url, key_prefix=key_prefix)
    try:
        assert isinstance(store, RedisStepStore)
        assert (store.key_prefix, store.max_snapshots_per_run) == (key_prefix, 2)
        assert isinstance(store.media_store, RedisMediaStore)  # 'auto' in the URL is a store option
        assert isinstance(media, RedisMediaStore)
        await store.register_run(RunRecord(run_id='by-url'))
        assert [r.run_id for r in await spec_store.list_runs()] == ['by-url']
        uri = await media.put(b'blob')
        assert isinstance(spec_store.media_store, RedisMediaStore)
        assert await spec_store.media_store.get(uri) == b'blob'
    finally:
        for s in (store, spec_store, media):
            await s.aclose()


def _doubler(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    calls = sum(1 for m in messages if isinstance(m, ModelResponse))
    if calls < 3:
        return ModelResponse(parts=[ToolCallPart('double', {'n': calls + 1}, tool_call_id=f'call-{calls}')])
    return ModelResponse(parts=[TextPart('all doubled')])


async def test_an_agent_run_persisted_through_from_spec_reads_back_in_a_new_store(
    redis_url: str, key_prefix: str
) -> None:
    persistence = StepPersistence.from_spec(backend='redis', url=redis_url, key_prefix=key_prefix, agent_name='d')
    assert isinstance(persistence.store, RedisStepStore)
    agent = Agent(FunctionModel(_doubler), capabilities=[persistence])

    @agent.tool_plain
    def double(n: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return 'x' * 3000 + str(2 * n)

    result = await agent.run('double 1, 2 and 3')
    await persistence.store.aclose()
    async with RedisStepStore(url=redis_url, key_prefix=key_prefix) as store:
        (run,) = await store.list_runs()
        assert run.agent_name == 'd'
        latest = await store.latest_snapshot(run.run_id)
        assert latest is not None
        assert latest.messages == result.all_messages()
        effects = await store.list_tool_effects(run.run_id)
        assert [(e.tool_call_id, e.status) for e in effects] == [
            (f'call-{i}', ToolEffectStatus.COMPLETED) for i in range(3)
        ]
        kinds = [e.kind for e in await store.list_events(run.run_id)]
        assert (kinds[0], kinds[-1]) == (EventKind.RUN_STARTED, EventKind.RUN_COMPLETED)


# -- keys --------------------------------------------------------------------------------------


async def test_key_prefixes_keep_applications_apart(
    redis_url: str, new_prefix: Callable[[], str], redis_client: Redis
) -> None:
    first, second = new_prefix(), new_prefix()
    async with (
        RedisStepStore(url=redis_url, key_prefix=first) as a,
        RedisStepStore(url=redis_url, key_prefix=second) as b,
    ):
        # ids holding ':' name their own keys, never another run's
        for run_id in ('team:1', 'team:1:ev', 'ev:team:1'):
            await write_tool_steps(a, run_id, 3, conversation_id='c:1')
        await write_tool_steps(b, 'team:1', 2, conversation_id='c:1')
        for run_id in ('team:1', 'team:1:ev', 'ev:team:1'):
            await check_tool_steps(a, run_id, 3)
        await check_tool_steps(b, 'team:1', 2)
        assert [r.run_id for r in await b.list_runs(conversation_id='c:1')] == ['team:1']
        assert await b.delete_run('team:1')
        await check_tool_steps(a, 'team:1', 3)
        # nothing of the deleted run is left, only the counters that keep ids from being reused
        assert await _prefix_keys(redis_client, second) == {f'{second}:runseq'.encode(), f'{second}:nodeids'.encode()}
        assert len(await a.list_runs(conversation_id='c:1')) == 3


async def test_each_save_stores_only_the_new_messages(store: RedisStepStore, redis_client: Redis) -> None:
    run_id = 'incremental'
    await store.register_run(RunRecord(run_id=run_id))
    node_key = store.keys.run(run_id).node
    for step in range(1, 31):
        await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=step, messages=_history(step)))
        assert await redis_client.hlen(node_key) == 1 + 2 * step  # pyright: ignore[reportUnknownMemberType, reportGeneralTypeIssues]
    snapshots = await store.list_snapshots(run_id)
    assert [s.messages for s in snapshots] == [_history(step) for step in range(1, 31)]


async def test_media_go_to_redis_by_default(store: RedisStepStore, redis_client: Redis) -> None:
    run_id = 'media'
    await store.register_run(RunRecord(run_id=run_id))
    image = BinaryContent(data=b'\x89PNG' + bytes(range(256)) * 400, media_type='image/png')
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(['look', image])])]
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=0, messages=messages))
    media_keys = {k for k in await _prefix_keys(redis_client, store.key_prefix) if b':media:' in k}
    assert len(media_keys) == 1
    latest = await store.latest_snapshot(run_id)
    assert latest is not None
    part = latest.messages[0].parts[0]
    assert isinstance(part, UserPromptPart)
    assert isinstance(part.content[1], BinaryContent)
    assert part.content[1].data == image.data


# -- the commit re-checks on the server ----------------------------------------------------------


def _cycle(run_id: str, tag: str) -> tuple[list[StepEvent | ToolEffectRecord], ContinuableSnapshot]:
    completed = ToolEffectRecord(
        run_id=run_id, tool_call_id='call-0', tool_name='lookup', status=ToolEffectStatus.COMPLETED
    )
    event = StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_COMPLETED, step_index=1, idempotency_key='done:call-0')
    snapshot = ContinuableSnapshot(run_id=run_id, step_index=1, messages=_history(1, tag), idempotency_key='s1')
    return [completed, event], snapshot


async def test_a_key_recorded_between_the_checks_and_the_commit_is_not_stored_twice(
    store: RedisStepStore, redis_url: str, key_prefix: str
) -> None:
    run_id = 'key-race'
    await store.register_run(RunRecord(run_id=run_id))
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=0, messages=_history(0)))
    writes, ours = _cycle(run_id, 'ours')
    _, theirs = _cycle(run_id, 'theirs')
    passed: list[str] = []

    async def other_writer() -> None:
        async with RedisStepStore(url=redis_url, key_prefix=key_prefix) as other:
            await other.save_snapshot(theirs)

    def hook(boundary: str) -> None:
        passed.append(boundary)
        if boundary == 'commit' and passed.count('commit') == 1:
            _in_another_process_like_writer(other_writer)

    with inject_faults(store, hook):
        await store.write_batch(writes, snapshot=ours)
    assert passed.count('commit') == 2, f'the write was not committed again after the conflict: {passed}'
    snapshots = await store.list_snapshots(run_id)
    assert [(s.step_index, s.messages) for s in snapshots] == [(0, _history(0)), (1, _history(1, 'theirs'))]
    effect = await store.get_tool_effect(run_id, 'call-0')
    assert effect is not None
    assert effect.status is ToolEffectStatus.COMPLETED
    assert [e.kind for e in await store.list_events(run_id)] == [EventKind.TOOL_CALL_COMPLETED]


async def test_a_history_whose_messages_vanished_before_the_commit_is_stored_whole(
    store: RedisStepStore, redis_url: str, key_prefix: str
) -> None:
    run_id = 'stale-race'
    await store.register_run(RunRecord(run_id=run_id))
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=0, messages=_history(2)))
    passed: list[str] = []

    async def other_writer() -> None:
        async with RedisStepStore(url=redis_url, key_prefix=key_prefix) as other:
            assert await other.delete_run(run_id)
            await other.register_run(RunRecord(run_id=run_id))

    def hook(boundary: str) -> None:
        passed.append(boundary)
        if boundary == 'commit' and passed.count('commit') == 1:
            _in_another_process_like_writer(other_writer)

    with inject_faults(store, hook):
        await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=1, messages=_history(3)))
    assert passed.count('commit') == 2, f'the save was not written again after the stale commit: {passed}'
    (snapshot,) = await store.list_snapshots(run_id)
    assert snapshot.messages == _history(3)


async def test_a_snapshot_row_keeps_its_step_index_for_earlier_versions(
    redis_url: str, key_prefix: str, new_prefix: Callable[[], str], redis_client: Redis
) -> None:
    # Earlier versions of this store read a snapshot row's third field as an integer: it holds the
    # step index in clear, and 0 where the record is encrypted.
    from step_redis.keys import unpack
    from stepcore import Encryption, generate_key

    sealed_prefix = new_prefix()
    async with (
        RedisStepStore(url=redis_url, key_prefix=key_prefix) as clear,
        RedisStepStore(
            url=redis_url, key_prefix=sealed_prefix, encryption=Encryption(keys={'k': generate_key()})
        ) as sealed,
    ):
        for store, expected in ((clear, [b'4', b'7']), (sealed, [b'0', b'0'])):
            for step in (4, 7):
                await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=step, messages=_history(step)))
            rows = await redis_client.hgetall(store.keys.run('r').snap)  # pyright: ignore[reportUnknownMemberType, reportGeneralTypeIssues]
            values = [unpack(value, 4)[2] for _, value in sorted(rows.items(), key=lambda kv: int(kv[0]))]  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType, reportUnknownLambdaType, reportUnknownVariableType]
            assert values == expected
            assert [s.step_index for s in await store.list_snapshots('r')] == [4, 7]


async def test_a_commit_whose_answer_is_lost_is_sent_again_and_applies_once(
    store: RedisStepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timeout after the commit script ran (its answer lost on the way) is retried with the same
    write id: the events and ledger entries are stored once, and the run goes on."""
    port = store.port
    run = port._script  # pyright: ignore[reportPrivateUsage]
    lost: list[int] = []

    async def answer_lost_once(script: Any, keys: Any, args: Any) -> Any:
        answer = await run(script, keys, args)
        if script is port._commit and not lost:  # pyright: ignore[reportPrivateUsage]
            lost.append(1)
            raise redis.exceptions.TimeoutError('Timeout reading from 127.0.0.1:6379')
        return answer

    monkeypatch.setattr(port, '_script', answer_lost_once)
    await write_tool_steps(store, 'lost-answer', steps=2)
    assert lost == [1]
    await check_tool_steps(store, 'lost-answer', steps=2)
    events = await store.list_events('lost-answer')
    assert len({event.seq for event in events}) == len(events)
    assert [event.seq for event in events] == list(range(1, len(events) + 1))


async def test_a_read_that_times_out_is_made_again(store: RedisStepStore, monkeypatch: pytest.MonkeyPatch) -> None:
    await write_tool_steps(store, 'read-again', steps=1)
    client = store.client
    hget = client.hget
    failures: list[int] = []

    async def flaky(*args: Any) -> Any:
        if len(failures) < 2:
            failures.append(1)
            raise redis.exceptions.ConnectionError('Connection reset by peer')
        return await hget(*args)

    monkeypatch.setattr(client, 'hget', flaky)
    run = await store.get_run(run_id='read-again')
    assert run is not None
    assert failures == [1, 1]
