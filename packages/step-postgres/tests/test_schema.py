"""Schema creation, versioning and migrations, and table prefix validation."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

import step_postgres.store
from step_postgres import PostgresMediaStore, PostgresStepStore, SchemaVersionError, validate_table_prefix
from step_postgres.schema import IDENTITY, LEASES, MEDIA, STEPS, Component, Tables, ensure_schema, schema_version
from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.ownership import open_lease
from stepcore.store.leases import Fence, RunFencedError, fencing


@pytest.mark.parametrize('prefix', ['a', '_', 'step_persistence', 'x1_', 'a' * 41])
def test_valid_prefixes(prefix: str) -> None:
    assert validate_table_prefix(prefix) == prefix


@pytest.mark.parametrize(
    'prefix',
    ['', 'A', '1abc', 'a-b', 'a b', 'a;drop table x', 'a"b', 'a' * 42, 'é', 'runs\n', None, 3],
)
def test_invalid_prefixes_are_refused_before_connecting(prefix: object) -> None:
    with pytest.raises(ValueError, match=r'table_prefix=.* is not a valid table prefix'):
        PostgresStepStore(dsn='postgresql://nobody@127.0.0.1:1/none', table_prefix=prefix)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='not a valid table prefix'):
        PostgresMediaStore(dsn='postgresql://nobody@127.0.0.1:1/none', table_prefix=prefix)  # type: ignore[arg-type]


def test_pool_or_dsn_is_required() -> None:
    with pytest.raises(ValueError, match=r'PostgresStepStore needs exactly one of pool= \(.*\) or dsn='):
        PostgresStepStore()
    with pytest.raises(ValueError, match=r'PostgresMediaStore needs exactly one of'):
        PostgresMediaStore()


def _tables(url: str, prefix: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            'SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, %s)',
            (prefix + '_',),
        ).fetchall()
    return {r[0].removeprefix(prefix + '_') for r in rows}


def _indexes(url: str, prefix: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            'SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND starts_with(indexname, %s)',
            (prefix + '_',),
        ).fetchall()
    return {r[0].removeprefix(prefix + '_') for r in rows}


async def test_first_use_creates_the_latest_schema(postgres_url: str, table_prefix: str) -> None:
    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    try:
        await store.register_run(RunRecord(run_id='r'))
        assert await store.get_run('r') is not None
        await store.media_store.put(b'blob')  # type: ignore[union-attr]
    finally:
        await store.aclose()
    assert _tables(postgres_url, table_prefix) == {
        'schema_version',
        'runs',
        'counters',
        'events',
        'event_keys',
        'nodes',
        'snapshots',
        'snapshot_keys',
        'tool_effects',
        'run_leases',
        'store_identity',
        'media',
    }
    assert {'runs_conversation', 'runs_parent', 'snapshots_state', 'tool_effects_status', 'run_leases_state'} <= (
        _indexes(postgres_url, table_prefix)
    )
    with psycopg.connect(postgres_url) as conn:
        versions = dict(
            conn.execute(Tables(table_prefix).query('SELECT component, version FROM {schema_version}')).fetchall()
        )
    assert versions == {
        'steps': STEPS.latest,
        'leases': LEASES.latest,
        'identity': IDENTITY.latest,
        'media': MEDIA.latest,
    }


async def test_older_schema_is_migrated_in_place(postgres_url: str, table_prefix: str) -> None:
    tables = Tables(table_prefix)
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        assert await ensure_schema(conn, tables, STEPS, target=1) == 1
        await conn.commit()
        # A run written by a version-1 deployment.
        record = RunRecord(run_id='old', conversation_id='c')
        await conn.execute(
            tables.query(
                'INSERT INTO {runs} (run_id, started_at, conversation_id, record) VALUES (%s, %s, %s, %s::json)'
            ),
            ('old', record.started_at, 'c', record.model_dump_json()),
        )
        await conn.commit()
    assert 'runs_conversation' not in _indexes(postgres_url, table_prefix)

    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    try:
        assert [r.run_id for r in await store.list_runs(conversation_id='c')] == ['old']
        await store.register_run(RunRecord(run_id='new', conversation_id='c'))
        assert [r.run_id for r in await store.list_runs(conversation_id='c')] == ['old', 'new']
    finally:
        await store.aclose()
    assert {'runs_conversation', 'runs_parent', 'runs_started'} <= _indexes(postgres_url, table_prefix)
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        assert await schema_version(conn, tables, STEPS) == STEPS.latest


async def test_newer_schema_is_refused(postgres_url: str, table_prefix: str) -> None:
    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    try:
        await store.register_run(RunRecord(run_id='r'))
    finally:
        await store.aclose()
    with psycopg.connect(postgres_url) as conn:
        conn.execute(
            Tables(table_prefix).query('UPDATE {schema_version} SET version = 99 WHERE component = %s'), ('steps',)
        )

    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    try:
        with pytest.raises(
            SchemaVersionError, match=r'steps schema version 99, newer than this step-postgres supports'
        ):
            await store.get_run('r')
    finally:
        await store.aclose()


async def test_migration_target_out_of_range(postgres_url: str, table_prefix: str) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        with pytest.raises(ValueError, match='not a version of the'):
            await ensure_schema(conn, Tables(table_prefix), STEPS, target=STEPS.latest + 1)


_CREATE_AT_ONCE = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from step_postgres import PostgresStepStore
    from stepcore import RunRecord

    async def main(url, prefix, run_id, go):
        store = PostgresStepStore(dsn=url, table_prefix=prefix)
        Path(f'{go}.{run_id}').write_text('')  # imported and ready: nothing is connected yet
        while not go.exists():
            await asyncio.sleep(0.002)
        try:
            await store.register_run(RunRecord(run_id=run_id))
            await store.media_store.put(run_id.encode())
        finally:
            await store.aclose()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
    """
)


def _create_at_once(postgres_url: str, table_prefix: str, go: Path, run_ids: list[str]) -> None:
    """Two processes that first connect at the same moment to a database without the tables."""
    procs = [
        subprocess.Popen(
            [sys.executable, '-c', _CREATE_AT_ONCE, postgres_url, table_prefix, run_id, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run_id in run_ids
    ]
    try:
        deadline = time.monotonic() + 120
        while not all(Path(f'{go}.{run_id}').exists() for run_id in run_ids):
            assert time.monotonic() < deadline, 'processes did not start'
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.005)
        go.write_text('go')
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


async def test_concurrent_schema_creation_from_two_processes(
    postgres_url: str, table_prefix: str, tmp_path: Path
) -> None:
    await asyncio.to_thread(_create_at_once, postgres_url, table_prefix, tmp_path / 'go', ['run-0', 'run-1'])
    tables = Tables(table_prefix)
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cur = await conn.execute(tables.query('SELECT run_id FROM {runs} ORDER BY run_id'))
        assert await cur.fetchall() == [('run-0',), ('run-1',)]
        cur = await conn.execute(tables.query('SELECT component, version FROM {schema_version} ORDER BY 1'))
        assert await cur.fetchall() == [
            ('identity', IDENTITY.latest),
            ('leases', LEASES.latest),
            ('media', MEDIA.latest),
            ('steps', STEPS.latest),
        ]
        cur = await conn.execute(tables.query('SELECT count(*) FROM {media}'))
        assert await cur.fetchone() == (2,)


async def test_concurrent_first_use_in_one_process(postgres_url: str, table_prefix: str) -> None:
    stores = [PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix) for _ in range(4)]
    try:
        await asyncio.gather(*(s.register_run(RunRecord(run_id=f'r{i}')) for i, s in enumerate(stores)))
        assert len(await stores[0].list_runs()) == 4
    finally:
        await asyncio.gather(*(s.aclose() for s in stores))


async def test_prefixes_are_isolated(postgres_url: str, new_prefix: Callable[[], str]) -> None:
    a = PostgresStepStore(dsn=postgres_url, table_prefix=new_prefix())
    b = PostgresStepStore(dsn=postgres_url, table_prefix=new_prefix())
    try:
        await a.register_run(RunRecord(run_id='same', agent_name='a'))
        await b.register_run(RunRecord(run_id='same', agent_name='b'))  # no duplicate: another set of tables
        assert [r.agent_name for r in await a.list_runs()] == ['a']
        assert [r.agent_name for r in await b.list_runs()] == ['b']
    finally:
        await a.aclose()
        await b.aclose()


async def test_the_longest_prefix_names_every_object_in_full(postgres_url: str, new_prefix: Callable[[], str]) -> None:
    prefix = (new_prefix() + '_' + 'x' * 41)[:41]  # '<fixture prefix>_...': dropped with the fixture's tables
    assert len(prefix) == 41
    store = PostgresStepStore(dsn=postgres_url, table_prefix=prefix)
    try:
        await store.register_run(RunRecord(run_id='r'))
        await store.media_store.put(b'blob')  # type: ignore[union-attr]
    finally:
        await store.aclose()
    with psycopg.connect(postgres_url) as conn:
        names = {
            row[0]
            for row in conn.execute(
                'SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace '
                "AND starts_with(relname, %s) AND relkind IN ('r', 'i', 'S') "
                # the leases' fence domain is a type
                'UNION SELECT typname FROM pg_type WHERE typnamespace = current_schema()::regnamespace '
                "AND starts_with(typname, %s) AND typtype = 'd'",
                (prefix + '_', prefix + '_'),
            ).fetchall()
        }
    expected = set(Tables(prefix).identifiers())
    assert {name.removeprefix(prefix + '_') for name in names} >= expected


async def test_an_index_built_beforehand_under_the_migration_name_is_kept(postgres_url: str, table_prefix: str) -> None:
    tables = Tables(table_prefix)
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        assert await ensure_schema(conn, tables, STEPS, target=2) == 2
        # What an operator runs on a large table before upgrading, without blocking writers.
        await conn.execute(tables.query('CREATE INDEX CONCURRENTLY {nodes_run} ON {nodes} (run_id)'))
    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    try:
        await store.register_run(RunRecord(run_id='r'))
        assert await store.delete_run('r') is True
    finally:
        await store.aclose()
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        assert await schema_version(conn, tables, STEPS) == STEPS.latest == 3
    assert 'nodes_run' in _indexes(postgres_url, table_prefix)


def _versions(url: str, prefix: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute(Tables(prefix).query('SELECT component, version FROM {schema_version}')).fetchall())


async def test_a_database_without_leases_gets_them_and_its_rows_still_read(
    postgres_url: str, table_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database the previous release made gets the lease table when this release first opens
    it; its rows read on, its runs take leases, and the step tables keep their version, so the
    previous release still opens it afterwards."""

    ensure = step_postgres.store.ensure_schema

    async def steps_only(conn: psycopg.AsyncConnection[Any], tables: Tables, component: Component) -> int:
        # The previous release: the same step tables and statements, and no leases or identity
        # component, so a store creates and migrates the step tables only, and never looks at the others.
        return 0 if component.name in ('leases', 'identity') else await ensure(conn, tables, component)

    run = RunRecord(run_id='old', conversation_id='c')
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hi')]), ModelResponse(parts=[TextPart('yo')])]
    snapshot = ContinuableSnapshot(run_id='old', messages=messages, step_index=1)
    event = StepEvent(run_id='old', kind=EventKind.RUN_STARTED, step_index=0)
    effect = ToolEffectRecord(run_id='old', tool_call_id='c1', tool_name='t', status=ToolEffectStatus.STARTED)
    with monkeypatch.context() as previous_release:
        previous_release.setattr(step_postgres.store, 'ensure_schema', steps_only)
        async with PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix) as old:
            await old.register_run(run)
            await old.write_batch([event, effect], snapshot=snapshot)
    assert 'run_leases' not in _tables(postgres_url, table_prefix)
    assert _versions(postgres_url, table_prefix) == {'steps': STEPS.latest}

    async with PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix) as store:
        assert await store.get_run('old') == run
        assert await store.list_runs(conversation_id='c') == [run]
        assert await store.list_events('old') == [event.model_copy(update={'seq': 1})]
        assert await store.get_tool_effect('old', 'c1') == effect
        assert await store.latest_snapshot('old') == snapshot.model_copy(update={'seq': 1})
        assert await store.get_lease('old') is None
        lease = await open_lease(store, 'old', ttl=60.0, start=messages)
        with fencing(Fence('old', lease.epoch)):
            await store.append_event(StepEvent(run_id='old', kind=EventKind.RUN_COMPLETED, step_index=1))
        assert await store.lease_start('old') == messages
    assert 'run_leases' in _tables(postgres_url, table_prefix)
    assert 'run_leases_state' in _indexes(postgres_url, table_prefix)
    now = {'steps': STEPS.latest, 'leases': LEASES.latest, 'identity': IDENTITY.latest}
    assert _versions(postgres_url, table_prefix) == now

    with monkeypatch.context() as previous_release:
        previous_release.setattr(step_postgres.store, 'ensure_schema', steps_only)
        async with PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix) as old:
            assert [e.seq for e in await old.list_events('old')] == [1, 2]
            await old.append_event(StepEvent(run_id='old', kind=EventKind.RUN_COMPLETED, step_index=2))
    assert _versions(postgres_url, table_prefix) == now


async def test_lease_tables_dropped_by_hand_are_made_again(postgres_url: str, table_prefix: str) -> None:
    """With the fence's domain, which dropping the table leaves behind: it is made anew too."""
    async with PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix) as store:
        await store.register_run(RunRecord(run_id='r'))
        await open_lease(store, 'r', ttl=60.0)
    tables = Tables(table_prefix)
    with psycopg.connect(postgres_url) as conn:
        conn.execute(tables.query('DROP TABLE {run_leases}'))
        conn.execute(tables.query("DELETE FROM {schema_version} WHERE component = 'leases'"))
    async with PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix) as store:
        assert await store.get_lease('r') is None
        lease = await open_lease(store, 'r', ttl=60.0)
        with fencing(Fence('r', lease.epoch)):
            await store.append_event(StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0))
        with fencing(Fence('r', lease.epoch + 1)), pytest.raises(RunFencedError):
            await store.append_event(StepEvent(run_id='r', kind=EventKind.RUN_COMPLETED, step_index=0))
        assert [e.step_index for e in await store.list_events('r')] == [0]
    assert _versions(postgres_url, table_prefix)['leases'] == LEASES.latest
