"""PostgresStepStore behaviour specific to PostgreSQL, against a real server."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool
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

import stepcore
from step_postgres import PostgresMediaStore, PostgresStepStore
from step_postgres.schema import STEPS, Tables, ensure_schema
from step_postgres.store import PostgresPort
from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.engine import DamagedRecordError, ops
from stepcore.engine.faults import InjectedFault, boundaries, inject_faults, stop_at
from stepcore.ownership import open_lease
from stepcore.store.codec import dump_record_json, encode_message
from stepcore.store.models import utcnow

Damage = Callable[..., Awaitable[None]]


@pytest.fixture
async def store(postgres_url: str, table_prefix: str) -> AsyncIterator[PostgresStepStore]:
    s = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    yield s
    await s.aclose()


def _exchange(i: int, size: int = 200) -> list[ModelMessage]:
    call = f'call-{i}'
    return [
        ModelResponse(parts=[ToolCallPart('lookup', {'i': i}, tool_call_id=call)]),
        ModelRequest(parts=[ToolReturnPart('lookup', f'result {i} ' + 'x' * size, tool_call_id=call)]),
    ]


def _rows(url: str, prefix: str, template: Any, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, row_factory=tuple_row) as conn:
        return conn.execute(Tables(prefix).query(template), params).fetchall()


def _execute(url: str, prefix: str, template: Any, params: tuple[Any, ...] = ()) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(Tables(prefix).query(template), params)


async def test_from_spec_builds_the_postgres_backends(postgres_url: str, table_prefix: str) -> None:
    store = stepcore.from_spec('postgres', dsn=postgres_url, table_prefix=table_prefix, max_snapshots_per_run=3)
    media = stepcore.media_from_spec('postgres', dsn=postgres_url, table_prefix=table_prefix)
    try:
        assert isinstance(store, PostgresStepStore)
        assert store.max_snapshots_per_run == 3
        assert isinstance(store.media_store, PostgresMediaStore)
        assert isinstance(media, PostgresMediaStore)
        await store.register_run(RunRecord(run_id='spec-run'))
        uri = await media.put(b'shared blob')
        # The step store's default media store uses the same table.
        assert await store.media_store.get(uri) == b'shared blob'
    finally:
        await store.aclose()
        await media.aclose()


async def test_a_given_pool_is_used_and_left_open(postgres_url: str, table_prefix: str) -> None:
    async with AsyncConnectionPool(postgres_url, min_size=1, max_size=2, open=False) as pool:
        store = PostgresStepStore(pool=pool, table_prefix=table_prefix)
        media = PostgresMediaStore(pool=pool, table_prefix=table_prefix)
        await store.register_run(RunRecord(run_id='pooled'))
        await media.put(b'x')
        await store.aclose()
        await media.aclose()
        assert not pool.closed
        async with pool.connection() as conn:
            cur = await conn.execute(Tables(table_prefix).query('SELECT count(*) FROM {runs}'))
            assert await cur.fetchone() == (1,)


async def test_a_given_pool_that_is_not_open_is_reported(postgres_url: str, table_prefix: str) -> None:
    pool = AsyncConnectionPool(postgres_url, min_size=1, open=False, name='app-pool')
    store = PostgresStepStore(pool=pool, table_prefix=table_prefix)
    with pytest.raises(RuntimeError, match=r"pool 'app-pool' given as pool= is not open: open it first"):
        await store.get_run('r')
    await store.aclose()
    assert pool.closed


async def test_an_owned_pool_is_closed(postgres_url: str, table_prefix: str) -> None:
    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    assert store.pool is None  # nothing is opened before first use
    await store.register_run(RunRecord(run_id='r'))
    pool = store.pool
    assert pool is not None
    assert not pool.closed
    await store.media_store.aclose()  # type: ignore[union-attr]  # shares the pool: must not close it
    assert not pool.closed
    await store.aclose()
    assert pool.closed


async def test_unreachable_server_error_names_the_server_without_password() -> None:
    store = PostgresStepStore(dsn='postgresql://someone:s3cret@127.0.0.1:1/nothing', connect_timeout=1)
    try:
        with pytest.raises(
            ConnectionError, match=r'could not connect to PostgreSQL at .*127\.0\.0\.1:1/nothing'
        ) as info:
            await store.get_run('r')
        assert 's3cret' not in str(info.value)
    finally:
        await store.aclose()


async def test_messages_are_stored_once_per_run(store: PostgresStepStore, postgres_url: str, table_prefix: str) -> None:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    for i in range(40):
        messages += _exchange(i)
        await store.save_snapshot(ContinuableSnapshot(run_id='long', step_index=i, messages=list(messages)))
    # 81 messages in the final history, 40 snapshots: each message is one node, written once.
    assert _rows(postgres_url, table_prefix, 'SELECT count(*) FROM {nodes}') == [(81,)]
    assert _rows(postgres_url, table_prefix, 'SELECT count(*), max(length) FROM {snapshots}') == [(40, 81)]
    latest = await store.latest_snapshot('long')
    assert latest is not None
    assert latest.messages == messages
    assert latest.seq == 40
    listed = await store.list_snapshots('long', include_interrupted=True)
    assert [len(s.messages) for s in listed] == [1 + 2 * (i + 1) for i in range(40)]
    assert listed[9].messages == messages[:21]


async def test_history_rewrite_keeps_every_snapshot_exact(store: PostgresStepStore) -> None:
    first: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')]), *_exchange(0), *_exchange(1)]
    await store.save_snapshot(ContinuableSnapshot(run_id='rw', messages=first, step_index=0))
    # A compaction replaces the middle of the history with a summary.
    compacted: list[ModelMessage] = [
        first[0],
        ModelResponse(parts=[TextPart('summary of two lookups')]),
        *_exchange(2),
    ]
    await store.save_snapshot(ContinuableSnapshot(run_id='rw', messages=compacted, step_index=0))
    # A fresh store (no memory of earlier saves) continues the compacted history.
    continued = [*compacted, *_exchange(3)]
    await store.save_snapshot(ContinuableSnapshot(run_id='rw', messages=continued, step_index=0))
    assert [s.messages for s in await store.list_snapshots('rw', include_interrupted=True)] == [
        first,
        compacted,
        continued,
    ]


async def test_a_fresh_store_continues_a_run(postgres_url: str, table_prefix: str) -> None:
    base: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')]), *_exchange(0)]
    a = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    b = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    try:
        await a.save_snapshot(ContinuableSnapshot(run_id='r', messages=base, step_index=0))
        longer = [*base, *_exchange(1)]
        await b.save_snapshot(ContinuableSnapshot(run_id='r', messages=longer, step_index=0))
        branch = [*base, *_exchange(7)]
        await a.save_snapshot(ContinuableSnapshot(run_id='r', messages=branch, step_index=0))
        assert [s.messages for s in await b.list_snapshots('r', include_interrupted=True)] == [base, longer, branch]
        assert [s.seq for s in await a.list_snapshots('r', include_interrupted=True)] == [1, 2, 3]
    finally:
        await a.aclose()
        await b.aclose()


async def test_pruning_deletes_snapshot_rows_only(postgres_url: str, table_prefix: str) -> None:
    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix, max_snapshots_per_run=2)
    try:
        messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
        await store.save_snapshot(ContinuableSnapshot(run_id='p', messages=list(messages), step_index=0))
        for i in range(5):
            messages += _exchange(i)
            await store.save_snapshot(
                ContinuableSnapshot(run_id='p', messages=list(messages), state=SnapshotState.INTERRUPTED, step_index=0)
            )
        # Kept: the newest two and the newest complete one (seq 1).
        assert [s.seq for s in await store.list_snapshots('p', include_interrupted=True)] == [1, 5, 6]
        assert _rows(postgres_url, table_prefix, 'SELECT count(*) FROM {nodes}') == [(11,)]
        complete = await store.latest_snapshot('p')
        assert complete is not None
        assert complete.seq == 1
        assert complete.messages == messages[:1]
        newest = await store.latest_snapshot('p', include_interrupted=True)
        assert newest is not None
        assert newest.messages == messages
    finally:
        await store.aclose()


async def test_snapshot_keys_stay_applied_after_pruning(postgres_url: str, table_prefix: str) -> None:
    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix, max_snapshots_per_run=1)
    try:
        msgs: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
        for key in ('k1', 'k2', 'k1'):
            await store.save_snapshot(ContinuableSnapshot(run_id='k', messages=msgs, idempotency_key=key, step_index=0))
        assert [s.seq for s in await store.list_snapshots('k', include_interrupted=True)] == [2]
    finally:
        await store.aclose()


async def test_sequences_are_per_run_and_gapless(store: PostgresStepStore) -> None:
    async def append(run_id: str, i: int) -> None:
        await store.append_event(StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_STARTED, step_index=i))
        # A replayed key is suppressed and does not consume a seq.
        await store.append_event(
            StepEvent(
                run_id=run_id, kind=EventKind.TOOL_CALL_STARTED, idempotency_key=f'{run_id}-{i % 3}', step_index=0
            )
        )

    await asyncio.gather(*(append(run_id, i) for run_id in ('a', 'b') for i in range(12)))
    for run_id in ('a', 'b'):
        events = await store.list_events(run_id)
        assert [e.seq for e in events] == list(range(1, 16))
        assert sorted(e.idempotency_key for e in events if e.idempotency_key) == [f'{run_id}-{k}' for k in range(3)]


async def test_unknown_marker_version_raises_on_latest_and_is_skipped_by_list(
    store: PostgresStepStore, postgres_url: str, table_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    good: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('plain')])]
    await store.save_snapshot(ContinuableSnapshot(run_id='m', messages=good, step_index=0))
    image: list[ModelMessage] = [
        *good,
        # over the 64 KiB threshold, so the image is stored as a marker
        ModelRequest(parts=[UserPromptPart(['look', BinaryContent(b'\x89PNG' * 17_000, media_type='image/png')])]),
    ]
    await store.save_snapshot(ContinuableSnapshot(run_id='m', messages=image, step_index=0))
    # A newer writer's marker format in the stored node of the image message.
    _execute(
        postgres_url,
        table_prefix,
        """UPDATE {nodes} SET body = convert_to(replace(convert_from(body, 'UTF8'),
        '"__stepcore_marker_format__":1', '"__stepcore_marker_format__":99'), 'UTF8')""",
    )
    # a body altered after it was written fails its checksum before its marker is read
    with pytest.raises(ValueError, match='fails its checksum'):
        await store.latest_snapshot('m')
    with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
        listed = await store.list_snapshots('m', include_interrupted=True)
    assert [s.seq for s in listed] == [1]
    assert "skipping an unparsable record: snapshot seq=2 of run 'm'" in caplog.text
    assert 'fails its checksum' in caplog.text


async def test_newer_record_format_is_refused(store: PostgresStepStore, postgres_url: str, table_prefix: str) -> None:
    await store.save_snapshot(ContinuableSnapshot(run_id='f', messages=[], step_index=0))
    _execute(
        postgres_url,
        table_prefix,
        """UPDATE {snapshots} SET record = (record::jsonb || '{{"format": 7}}'::jsonb)::json""",
    )
    with pytest.raises(ValueError, match='format version 7'):
        await store.latest_snapshot('f')
    assert await store.list_snapshots('f', include_interrupted=True) == []


async def test_media_is_externalized_to_the_same_database(
    store: PostgresStepStore, postgres_url: str, table_prefix: str
) -> None:
    big = 'y' * (70 * 1024)
    data = bytes(range(256)) * 300  # 75 KiB: binary content goes out from the 64 KiB threshold on
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(['pic', BinaryContent(data, media_type='image/png')])]),
        ModelRequest(parts=[ToolReturnPart('dump', big, tool_call_id='c')]),
    ]
    await store.save_snapshot(ContinuableSnapshot(run_id='media', messages=messages, step_index=0))
    blobs = _rows(postgres_url, table_prefix, 'SELECT media_type, length(data) FROM {media} ORDER BY 2')
    assert blobs == [('text/plain; charset=utf-8', len(big)), ('image/png', len(data))]
    (longest,) = _rows(postgres_url, table_prefix, 'SELECT max(length(body)) FROM {nodes}')[0]
    assert longest < 2048  # the node rows hold markers, not the payloads
    latest = await store.latest_snapshot('media')
    assert latest is not None
    assert latest.messages[1] == messages[1]
    part = latest.messages[0].parts[0]
    assert isinstance(part, UserPromptPart)
    assert isinstance(part.content[1], BinaryContent)
    assert part.content[1].data == data


async def test_media_store_none_keeps_payloads_inline(postgres_url: str, table_prefix: str) -> None:
    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix, media_store=None)
    try:
        data = b'\x00\x01' * 40_000
        messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart([BinaryContent(data, media_type='a/b')])])]
        await store.save_snapshot(ContinuableSnapshot(run_id='inline', messages=messages, step_index=0))
        latest = await store.latest_snapshot('inline')
        assert latest is not None
        part = latest.messages[0].parts[0]
        assert isinstance(part, UserPromptPart)
        assert isinstance(part.content[0], BinaryContent)
        assert part.content[0].data == data
        assert store.media_store is None
        # Nothing was externalized, so the media table was never needed.
        assert _rows(postgres_url, table_prefix, 'SELECT to_regclass(%s) IS NULL', (f'{table_prefix}_media',)) == [
            (True,)
        ]
    finally:
        await store.aclose()


async def test_tool_effect_upsert_keeps_first_listing_position(store: PostgresStepStore) -> None:
    first = ToolEffectRecord(run_id='e', tool_call_id='c1', tool_name='send', status=ToolEffectStatus.STARTED)
    second = ToolEffectRecord(
        run_id='e', tool_call_id='c2', tool_name='send', started_at=first.started_at, status=ToolEffectStatus.STARTED
    )
    await store.record_tool_effect(first)
    await store.record_tool_effect(second)
    done = first.model_copy(update={'status': ToolEffectStatus.COMPLETED, 'effect_summary': 'mail sent'})
    await store.record_tool_effect(done)
    assert [r.tool_call_id for r in await store.list_tool_effects('e')] == ['c1', 'c2']
    assert await store.get_tool_effect('e', 'c1') == done
    assert [r.tool_call_id for r in await store.list_unresolved_tool_effects('e')] == ['c2']


async def test_registration_retry_and_duplicate(store: PostgresStepStore) -> None:
    record = RunRecord(run_id='dup', registration_id='reg-1', metadata={'k': 'v'})
    await store.register_run(record)
    await store.register_run(record.model_copy())  # the same registration retried
    with pytest.raises(ValueError, match="run_id 'dup' is already in the store"):
        await store.register_run(RunRecord(run_id='dup', registration_id='reg-2'))
    assert await store.get_run('dup') == record


async def test_every_protocol_query_can_use_an_index(
    store: PostgresStepStore, postgres_url: str, table_prefix: str
) -> None:
    await store.register_run(RunRecord(run_id='r', conversation_id='c', parent_run_id='p'))
    await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=_exchange(0), step_index=0))
    await store.append_event(StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0))
    await store.record_tool_effect(
        ToolEffectRecord(run_id='r', tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
    )
    port = store.port
    assert isinstance(port, PostgresPort)
    q = port._q
    snapshot = {'run': 'r', 'complete': 'complete'}
    lease = {
        'run': 'r',
        'epoch': 2,
        'state': 'running',
        'host': 'h',
        'ttl': 60.0,
        'body': '{}',
        'start': None,
        'expect': 1,
        'expired': True,
        'expect_expires': None,
    }
    checks: list[tuple[Any, Any]] = [
        (q.run_get, ('r',)),
        *(
            ask.request
            for ask in (
                port.ask_list_runs(ops.ListRuns(conversation_id='c')),
                port.ask_list_runs(ops.ListRuns(parent_run_id='p')),
                port.ask_list_runs(ops.ListRuns(conversation_id='c', parent_run_id='p')),
                port.ask_list_runs(ops.ListRuns()),
                port.ask_list_runs(ops.ListRuns(after=(utcnow(), 'r'), limit=10)),
                port.ask_list_runs(ops.ListRuns(started_before=utcnow(), newest_first=True, limit=10)),
                port.ask_list_runs(ops.ListRuns(conversation_id='c', after=(utcnow(), 'r'), limit=10)),
            )
        ),
        (q.events_list, ('r',)),
        *((query, snapshot) for query in q.snapshots.values()),
        (q.snapshot_states, ('r',)),
        (q.snapshot_key_applied, ('r', 'k')),
        (q.node_exists, (1, 'r')),
        (q.nodes_reach, {'run': 'r', 'heads': [1, 2]}),
        (q.effect_get, ('r', 'c')),
        (q.effects_list, ('r',)),
        (q.run_delete, {'run': 'r'}),
        (q.lease_get, ('r',)),
        (q.leases_list, (['running', 'waiting'],)),
        (q.lease_start, ('r',)),
        (q.lease_epochs, (['r', 's'],)),
        (q.lease_lock, ('r',)),
        (q.lease_check, ('r', 1)),
        *((query, lease) for query in (q.lease_insert, q.lease_update)),
    ]
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        await conn.execute('SET enable_seqscan = off')
        for query, params in checks:
            cur = await conn.execute(sql.SQL('EXPLAIN ') + query, params)
            plan = '\n'.join(str(row[0]) for row in await cur.fetchall())
            assert 'Seq Scan' not in plan, f'{query.as_string(conn)}\n{plan}'


async def test_nul_characters_in_record_fields_round_trip(store: PostgresStepStore) -> None:
    record = RunRecord(run_id='nul', metadata={'note': 'a\x00b'})
    await store.register_run(record)
    assert await store.get_run('nul') == record
    effect = ToolEffectRecord(
        run_id='nul',
        tool_call_id='c',
        tool_name='t',
        args={'text': 'x\x00y'},
        error='e\x00',
        status=ToolEffectStatus.STARTED,
    )
    await store.record_tool_effect(effect)
    assert await store.get_tool_effect('nul', 'c') == effect
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('before\x00after')])]
    await store.save_snapshot(
        ContinuableSnapshot(run_id='nul', messages=messages, metadata={'k': '\x00'}, step_index=0)
    )
    latest = await store.latest_snapshot('nul')
    assert latest is not None
    assert latest.messages == messages
    assert latest.metadata == {'k': '\x00'}


_BAD_BODY = b'{"format":1,"metadata":17}'
"""Valid JSON that is no valid record of any kind (nor a message)."""


async def _damaged_run(store: PostgresStepStore) -> list[ModelMessage]:
    """Run 'dmg' with two events, a ledger entry and two snapshots; run 'fine' beside it."""
    await store.register_run(RunRecord(run_id='fine'))
    await store.register_run(RunRecord(run_id='dmg'))
    first: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('marker-a')])]
    await store.write_batch(
        [
            StepEvent(run_id='dmg', kind=EventKind.RUN_STARTED, step_index=0),
            ToolEffectRecord(run_id='dmg', tool_call_id='c1', tool_name='t', status=ToolEffectStatus.STARTED),
            StepEvent(run_id='dmg', kind=EventKind.TOOL_CALL_STARTED, tool_call_id='c1', step_index=0),
        ],
        snapshot=ContinuableSnapshot(run_id='dmg', messages=first, step_index=0),
    )
    second = [*first, ModelResponse(parts=[TextPart('marker-b')])]
    await store.save_snapshot(ContinuableSnapshot(run_id='dmg', messages=second, step_index=0))
    return second


async def test_damaged_event_is_skipped_with_a_warning(
    store: PostgresStepStore, postgres_damage: Damage, caplog: pytest.LogCaptureFixture
) -> None:
    await _damaged_run(store)
    await postgres_damage(store, 'event', 'dmg', 1, _BAD_BODY)
    with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
        events = await store.list_events('dmg')
    assert [e.seq for e in events] == [2]
    assert "skipping an unparsable record: event seq=1 of run 'dmg'" in caplog.text


async def test_damaged_ledger_entry_is_an_error_naming_the_run(
    store: PostgresStepStore, postgres_damage: Damage
) -> None:
    await _damaged_run(store)
    await postgres_damage(store, 'effect', 'dmg', 'c1', _BAD_BODY)
    with pytest.raises(DamagedRecordError, match="ledger entry of tool call 'c1' of run 'dmg'"):
        await store.list_tool_effects('dmg')
    with pytest.raises(DamagedRecordError, match="of run 'dmg'"):
        await store.list_unresolved_tool_effects('dmg')


async def test_damaged_snapshot_header_is_an_error_alone_and_skipped_in_the_list(
    store: PostgresStepStore, postgres_damage: Damage, caplog: pytest.LogCaptureFixture
) -> None:
    messages = await _damaged_run(store)
    await postgres_damage(store, 'snapshot', 'dmg', 2, _BAD_BODY)
    with pytest.raises(DamagedRecordError, match="snapshot seq=2 of run 'dmg'"):
        await store.latest_snapshot('dmg')
    with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
        listed = await store.list_snapshots('dmg', include_interrupted=True)
    assert [(s.seq, s.messages) for s in listed] == [(1, messages[:1])]
    assert "snapshot seq=2 of run 'dmg'" in caplog.text


async def test_damaged_message_fails_only_the_snapshots_holding_it(
    store: PostgresStepStore, postgres_damage: Damage
) -> None:
    messages = await _damaged_run(store)
    await postgres_damage(store, 'message', 'dmg', 'marker-b', _BAD_BODY)
    with pytest.raises(DamagedRecordError, match=r"snapshot seq=2 of run 'dmg' .*message 1 \(node \d+\) is damaged"):
        await store.latest_snapshot('dmg')
    assert [(s.seq, s.messages) for s in await store.list_snapshots('dmg', include_interrupted=True)] == [
        (1, messages[:1])
    ]


async def test_damaged_run_record_leaves_only_that_run_out(store: PostgresStepStore, postgres_damage: Damage) -> None:
    await _damaged_run(store)
    await postgres_damage(store, 'run', 'dmg', None, _BAD_BODY)
    assert [r.run_id for r in await store.list_runs()] == ['fine']
    with pytest.raises(DamagedRecordError, match="run record of run 'dmg'"):
        await store.get_run('dmg')
    assert [e.seq for e in await store.list_events('dmg')] == [1, 2]


_NUL_WRITES: dict[str, tuple[Callable[[PostgresStepStore], Awaitable[object]], str]] = {
    'register_run': (lambda s: s.register_run(RunRecord(run_id='a\x00b')), "run_id 'a\\x00b'"),
    'get_run': (lambda s: s.get_run('a\x00b'), "run_id 'a\\x00b'"),
    'list_events': (lambda s: s.list_events('\x00'), "run_id '\\x00'"),
    'event key': (
        lambda s: s.append_event(
            StepEvent(run_id='r', kind=EventKind.RUN_STARTED, idempotency_key='k\x00', step_index=0)
        ),
        "idempotency_key 'k\\x00'",
    ),
    'snapshot key': (
        lambda s: s.save_snapshot(
            ContinuableSnapshot(run_id='r', idempotency_key='\x00snap', step_index=0, messages=[])
        ),
        "idempotency_key '\\x00snap'",
    ),
    'tool_call_id': (
        lambda s: s.record_tool_effect(
            ToolEffectRecord(run_id='r', tool_call_id='c\x00', tool_name='t', status=ToolEffectStatus.STARTED)
        ),
        "tool_call_id 'c\\x00'",
    ),
}


@pytest.mark.parametrize('case', list(_NUL_WRITES))
async def test_nul_in_a_run_id_or_key_is_refused_naming_it(
    store: PostgresStepStore,
    postgres_url: str,
    table_prefix: str,
    case: str,
) -> None:
    write, named = _NUL_WRITES[case]
    with pytest.raises(ValueError, match=re.escape(named) + '.*without NUL characters'):
        await write(store)
    assert await store.list_runs() == []
    assert _rows(postgres_url, table_prefix, 'SELECT count(*) FROM {events}') == [(0,)]


async def test_delete_run_removes_every_row_of_the_run(
    store: PostgresStepStore, postgres_url: str, table_prefix: str
) -> None:
    start = _exchange(0)

    async def write(run_id: str) -> None:
        await store.register_run(RunRecord(run_id=run_id))
        await open_lease(store, run_id, ttl=60.0, start=start)
        await store.write_batch(
            [
                ToolEffectRecord(run_id=run_id, tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED),
                StepEvent(run_id=run_id, kind=EventKind.RUN_STARTED, idempotency_key='e', step_index=0),
            ],
            snapshot=ContinuableSnapshot(run_id=run_id, messages=_exchange(0), idempotency_key='s', step_index=0),
        )

    await write('gone')
    await write('kept')
    tables = (
        'runs',
        'counters',
        'events',
        'event_keys',
        'nodes',
        'snapshots',
        'snapshot_keys',
        'tool_effects',
        'run_leases',
    )

    def counts(run_id: str) -> list[int]:
        with psycopg.connect(postgres_url) as conn:
            return [
                conn.execute(
                    sql.SQL('SELECT count(*) FROM {} WHERE run_id = %s').format(
                        sql.Identifier(f'{table_prefix}_{table}')
                    ),
                    (run_id,),
                ).fetchone()[0]  # type: ignore[index]
                for table in tables
            ]

    before = counts('kept')
    assert all(before)
    assert counts('gone') == before
    assert await store.delete_run('gone') is True
    assert counts('gone') == [0] * len(tables)
    assert counts('kept') == before
    assert await store.get_lease('gone') is None
    assert await store.lease_start('gone') is None
    assert await store.lease_start('kept') == start
    assert await store.delete_run('gone') is False
    # A run written again under the same id starts afresh: seqs from 1, its keys not applied.
    await write('gone')
    assert [e.seq for e in await store.list_events('gone')] == [1]
    assert [s.seq for s in await store.list_snapshots('gone', include_interrupted=True)] == [1]


async def test_a_snapshot_key_recorded_meanwhile_is_retried_not_written_twice(
    store: PostgresStepStore, postgres_url: str, table_prefix: str
) -> None:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    await store.save_snapshot(ContinuableSnapshot(run_id='race', messages=messages, step_index=0))
    raced: list[str] = []

    def other_writer(boundary: str) -> None:
        # Another writer (one that takes no run lock) records the key after the store checked it.
        if boundary == 'put_snapshot' and not raced:
            raced.append(boundary)
            _execute(
                postgres_url,
                table_prefix,
                'INSERT INTO {snapshot_keys} (run_id, idempotency_key) VALUES (%s, %s)',
                ('race', 'k'),
            )

    longer = [*messages, *_exchange(1)]
    with inject_faults(store, other_writer):
        await store.save_snapshot(
            ContinuableSnapshot(run_id='race', messages=longer, idempotency_key='k', step_index=0)
        )
    assert raced == ['put_snapshot']
    assert [s.seq for s in await store.list_snapshots('race', include_interrupted=True)] == [1]
    assert _rows(postgres_url, table_prefix, 'SELECT count(*) FROM {nodes}') == [(1,)]
    # The next save of the run still continues its history.
    await store.save_snapshot(ContinuableSnapshot(run_id='race', messages=longer, step_index=0))
    latest = await store.latest_snapshot('race')
    assert latest is not None
    assert (latest.seq, latest.messages) == (2, longer)


async def test_a_batch_stopped_at_any_write_boundary_leaves_all_or_nothing(store: PostgresStepStore) -> None:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')]), *_exchange(0)]

    def batch(run_id: str) -> Callable[[], Awaitable[None]]:
        def write() -> Awaitable[None]:
            return store.write_batch(
                [
                    ToolEffectRecord(
                        run_id=run_id, tool_call_id='call-0', tool_name='lookup', status=ToolEffectStatus.STARTED
                    ).model_copy(update={'status': ToolEffectStatus.COMPLETED}),
                    StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_COMPLETED, tool_call_id='call-0', step_index=0),
                ],
                snapshot=ContinuableSnapshot(run_id=run_id, messages=messages, idempotency_key='s1', step_index=0),
            )

        return write

    passed = await boundaries(store, batch('probe'))
    assert passed[-2:] == ['commit', 'committed']
    for index, boundary in enumerate(passed):
        run_id = f'stop-{index}'
        with inject_faults(store, stop_at(index)), pytest.raises(InjectedFault):
            await batch(run_id)()
        written = (
            await store.latest_snapshot(run_id),
            await store.list_tool_effects(run_id),
            await store.list_events(run_id),
        )
        if boundary == 'committed':
            assert written[0] is not None
            assert written[0].messages == messages
            assert [r.status for r in written[1]] == [ToolEffectStatus.COMPLETED]
            assert len(written[2]) == 1
        else:
            assert written == (None, [], []), boundary


async def test_a_given_pool_outside_autocommit_gets_its_connections_back_unchanged(
    postgres_url: str, table_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with AsyncConnectionPool(postgres_url, min_size=1, max_size=1, open=False) as pool:
        store = PostgresStepStore(pool=pool, table_prefix=table_prefix)
        with caplog.at_level(logging.WARNING, logger='psycopg'):
            await store.register_run(RunRecord(run_id='r'))
            await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=_exchange(0), step_index=0))
            assert await store.get_run('r') is not None
        assert caplog.records == []  # no connection went back inside a transaction
        async with pool.connection() as conn:
            assert not conn.autocommit
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        await store.aclose()


async def test_rows_of_the_previous_release_are_read_and_continued(postgres_url: str, table_prefix: str) -> None:
    """Full records as JSON (events and snapshot headers without seq), schema version 2."""
    tables = Tables(table_prefix)
    run = RunRecord(run_id='old', conversation_id='c', registration_id='reg', metadata={'k': 'v'})
    event = StepEvent(run_id='old', kind=EventKind.RUN_STARTED, idempotency_key='e1', step_index=0)
    effect = ToolEffectRecord(
        run_id='old', tool_call_id='c1', tool_name='t', args={'x': 1}, status=ToolEffectStatus.STARTED
    )
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hi')]), ModelResponse(parts=[TextPart('yo')])]
    snapshot = ContinuableSnapshot(run_id='old', messages=messages, step_index=3, idempotency_key='s1')
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await ensure_schema(conn, tables, STEPS, target=2)
        q = tables.query
        await conn.execute(
            q(
                """INSERT INTO {runs} (run_id, started_at, conversation_id, registration_id, record)
                VALUES (%s, %s, %s, %s, %s::json)"""
            ),
            ('old', run.started_at, 'c', 'reg', dump_record_json(run)),
        )
        await conn.execute(q("INSERT INTO {counters} VALUES ('old', 'event', 1), ('old', 'snapshot', 1)"))
        await conn.execute(q("INSERT INTO {event_keys} VALUES ('old', 'e1')"))
        await conn.execute(q("INSERT INTO {snapshot_keys} VALUES ('old', 's1')"))
        await conn.execute(
            q("INSERT INTO {events} (run_id, seq, idempotency_key, record) VALUES ('old', 1, 'e1', %s::json)"),
            (dump_record_json(event, exclude={'seq'}),),
        )
        await conn.execute(
            q(
                """INSERT INTO {tool_effects} (run_id, tool_call_id, status, started_at, record)
                VALUES ('old', 'c1', 'started', %s, %s::json)"""
            ),
            (effect.started_at, dump_record_json(effect)),
        )
        head = None
        for message in messages:
            cursor = await conn.execute(
                q("INSERT INTO {nodes} VALUES (nextval(%s::regclass), 'old', %s, %s) RETURNING node_id"),
                (tables.name('node_ids'), head, encode_message(message)),
            )
            (head,) = cast(tuple[int], await cursor.fetchone())
        await conn.execute(
            q(
                """INSERT INTO {snapshots} (run_id, seq, state, step_index, head, length, record)
                VALUES ('old', 1, 'complete', 3, %s, 2, %s::json)"""
            ),
            (head, dump_record_json(snapshot, exclude={'messages', 'seq'})),
        )

    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    try:
        assert await store.get_run('old') == run
        assert await store.list_runs(conversation_id='c') == [run]
        await store.register_run(run.model_copy())  # the same registration, retried
        assert await store.list_events('old') == [event.model_copy(update={'seq': 1})]
        assert await store.get_tool_effect('old', 'c1') == effect
        assert await store.list_unresolved_tool_effects('old') == [effect]
        assert await store.latest_snapshot('old') == snapshot.model_copy(update={'seq': 1})
        # Writing goes on where the previous release left off.
        await store.append_event(event.model_copy())  # its key was applied: suppressed
        await store.append_event(StepEvent(run_id='old', kind=EventKind.RUN_COMPLETED, step_index=0))
        assert [e.seq for e in await store.list_events('old')] == [1, 2]
        await store.save_snapshot(snapshot.model_copy())  # suppressed too
        longer = [*messages, ModelResponse(parts=[TextPart('more')])]
        await store.save_snapshot(ContinuableSnapshot(run_id='old', messages=longer, step_index=0))
        assert [(s.seq, s.messages) for s in await store.list_snapshots('old', include_interrupted=True)] == [
            (1, messages),
            (2, longer),
        ]
        assert await store.delete_run('old') is True
        assert await store.list_runs() == []
    finally:
        await store.aclose()


async def test_the_step_index_column_stays_filled_for_earlier_versions(
    postgres_url: str, table_prefix: str, new_prefix: Callable[[], str]
) -> None:
    # Earlier versions of this store wrote and read the `step_index` column: it holds the step
    # index in clear, and 0 where the record is encrypted.
    from stepcore import Encryption, generate_key

    sealed_prefix = new_prefix()
    async with (
        PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix) as clear,
        PostgresStepStore(
            dsn=postgres_url, table_prefix=sealed_prefix, encryption=Encryption(keys={'k': generate_key()})
        ) as sealed,
    ):
        for store, prefix, expected in ((clear, table_prefix, [4, 7]), (sealed, sealed_prefix, [0, 0])):
            for step in (4, 7):
                messages = [m for i in range(step) for m in _exchange(i)]
                await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=step, messages=messages))
            rows = _rows(postgres_url, prefix, 'SELECT step_index FROM {snapshots} ORDER BY seq')
            assert [r[0] for r in rows] == expected
            assert [s.step_index for s in await store.list_snapshots('r')] == [4, 7]
