"""`SqliteStepStore` on a database written by pydantic-ai-harness: migrated in place, after a backup.

The databases are the fixtures the real pydantic-ai-harness wrote (0.62.0, 0.57.0, and the
layout without the snapshot `state` column; see scripts/harness/make_fixtures.py), copied before
each test, since opening one changes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import sqlite3
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, BinaryContent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_sqlite import SqliteConversationStore, SqliteMediaStore, SqliteStepStore
from stepcore import ContinuableSnapshot, StepPersistence, continue_run
from stepcore.harness import is_harness_sqlite
from stepcore.recovery import inspect_recovery

FIXTURES = Path(__file__).parent / 'fixtures' / 'harness'
RELEASES = {'0.62.0': ('harness.db', 'manifest.json'), '0.57.0': ('harness-0.57.0.db', 'manifest-0.57.0.json')}


def _copy(tmp_path: Path, name: str) -> Path:
    target = tmp_path / 'runs.db'
    shutil.copy(FIXTURES / name, target)
    return target


def _manifest(release: str) -> dict[str, Any]:
    return json.loads((FIXTURES / RELEASES[release][1]).read_text())


def _dump(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return list(conn.iterdump())


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


async def _all_snapshots(store: SqliteStepStore, run_id: str) -> list[ContinuableSnapshot]:
    """Every retained snapshot, interrupted ones included, whichever `list_snapshots` the store has."""
    try:
        return await store.list_snapshots(run_id, include_interrupted=True)  # type: ignore[call-arg]
    except TypeError:
        return await store.list_snapshots(run_id)


async def _summary(store: SqliteStepStore, run_id: str) -> dict[str, Any]:
    snapshots = await _all_snapshots(store, run_id)
    return {
        'events': [(e.kind.value, e.tool_call_id, e.idempotency_key) for e in await store.list_events(run_id)],
        'snapshots': [(s.state.value, s.step_index, s.idempotency_key, len(s.messages)) for s in snapshots],
        'effects': sorted(
            (e.tool_call_id, e.status.value, e.idempotency_key, e.effect_summary)
            for e in await store.list_tool_effects(run_id)
        ),
    }


def _expected(run: dict[str, Any]) -> dict[str, Any]:
    return {
        'events': [(e['kind'], e['tool_call_id'], e['idempotency_key']) for e in run['events']],
        'snapshots': [
            (s['state'], s['step_index'], s['idempotency_key'], s['message_count']) for s in run['snapshots']
        ],
        'effects': sorted(
            (e['tool_call_id'], e['status'], e['idempotency_key'], e['effect_summary']) for e in run['tool_effects']
        ),
    }


@pytest.mark.parametrize('release', list(RELEASES))
async def test_a_harness_database_is_migrated_in_place_with_a_backup(
    release: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    database = _copy(tmp_path, RELEASES[release][0])
    original = _dump(database)
    manifest = _manifest(release)
    with caplog.at_level(logging.WARNING, logger='step_sqlite.harness'):
        async with SqliteStepStore(database=database) as store:
            runs = await store.list_runs()
            assert [r.run_id for r in runs] == [r['run_id'] for r in manifest['runs']]
            for run in manifest['runs']:
                record = await store.get_run(run['run_id'])
                assert record is not None
                assert (record.agent_name, record.conversation_id, record.parent_run_id, record.metadata) == (
                    run['agent_name'],
                    run['conversation_id'],
                    run['parent_run_id'],
                    run['metadata'],
                )
                assert await _summary(store, run['run_id']) == _expected(run), run['run_id']
    backup = tmp_path / 'runs.db.harness-backup'
    assert [r.getMessage() for r in caplog.records] == [
        f"migrated database '{database}' from pydantic-ai-harness to stepcore ({len(manifest['runs'])} runs, "
        f'{sum(len(r["snapshots"]) for r in manifest["runs"])} snapshots, '
        f'{sum(len(r["events"]) for r in manifest["runs"])} events, '
        f'{sum(len(r["tool_effects"]) for r in manifest["runs"])} ledger entries); the original is kept at {backup}'
    ]
    assert _dump(backup) == original
    assert backup.stat().st_mode & 0o777 == 0o600
    with sqlite3.connect(backup) as conn:
        assert conn.execute('PRAGMA journal_mode').fetchone() == ('delete',)
    assert not {'harness_runs', 'snapshot_messages', 'snapshot_message_refs'} & _tables(database)
    assert {'stepcore_schema', 'message_nodes', 'conversations'} <= _tables(database)

    caplog.clear()
    async with SqliteStepStore(database=database) as store:  # already migrated: nothing happens
        assert len(await store.list_runs()) == len(manifest['runs'])
    assert not caplog.records
    assert sorted(p.name for p in tmp_path.iterdir() if 'backup' in p.name) == ['runs.db.harness-backup']


@pytest.mark.parametrize('release', list(RELEASES))
async def test_a_migrated_run_resumes_and_reports_its_unresolved_charge(release: str, tmp_path: Path) -> None:
    database = _copy(tmp_path, RELEASES[release][0])
    async with SqliteStepStore(database=database) as store:
        report = await inspect_recovery(store=store, run_id='fx-crashed')
        assert [(e.tool_call_id, e.idempotency_key) for e in report.unresolved_effects] == [
            ('call-crash-2', 'charge-order-42')
        ]
        history = await continue_run(store, run_id='fx-crashed')

        def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            return ModelResponse(parts=[TextPart(f'resumed after {len(messages)} messages')])

        agent = Agent(
            FunctionModel(respond),
            capabilities=[StepPersistence(store=store, run_id='fx-crashed-2', agent_name='shop')],
        )
        result = await agent.run(message_history=history, conversation_id='conv-crash')
        assert result.output == f'resumed after {len(history)} messages'
        assert [r.run_id for r in await store.list_runs(conversation_id='conv-crash')] == ['fx-crashed', 'fx-crashed-2']


def _prompt_images(messages: list[ModelMessage]) -> list[bytes]:
    prompt = next(p for m in messages for p in m.parts if isinstance(p, UserPromptPart))
    return [c.data for c in prompt.content if isinstance(c, BinaryContent)]


@pytest.mark.parametrize('inline', [False, True], ids=['default-media', 'media_store=None'])
async def test_media_is_kept_in_the_database(inline: bool, tmp_path: Path) -> None:
    database = _copy(tmp_path, 'harness.db')
    media = {
        m['kind']: m['sha256'] for r in _manifest('0.62.0')['runs'] if r['run_id'] == 'fx-media' for m in r['media']
    }
    opened = datetime.now(UTC) - timedelta(seconds=1)
    options: dict[str, Any] = {'media_store': None} if inline else {}
    async with SqliteStepStore(database=database, **options) as store:
        latest = await store.latest_snapshot('fx-media')
        assert latest is not None
        images = _prompt_images(latest.messages)
        assert [len(i) for i in images] == [64 * 1024, 16]
        assert hashlib.sha256(images[0]).hexdigest() == media['binary']
    with sqlite3.connect(database) as conn:
        stored = {r[0] for r in conn.execute('SELECT digest FROM media')}
        inline_bodies = conn.execute('SELECT count(*) FROM message_nodes WHERE length(body) > 32768').fetchone()[0]
    assert {media['binary'], media['text']} <= stored  # the harness's blobs are kept either way
    assert (inline_bodies > 0) == inline  # the store's default media store takes the payloads out again
    blobs = SqliteMediaStore(database=database)
    try:
        assert hashlib.sha256(await blobs.get(f'media+sha256://{media["text"]}')).hexdigest() == media['text']
        # copied now: within any grace period, so a collection does not take them the moment they arrive
        assert all([blob.stored_at >= opened async for blob in blobs.list_media()])
    finally:
        await blobs.aclose()


async def test_the_layout_without_a_state_column_is_migrated(tmp_path: Path) -> None:
    database = _copy(tmp_path, 'harness-pre-state.db')
    with sqlite3.connect(database) as conn:
        assert 'state' not in {r[1] for r in conn.execute('PRAGMA table_info(snapshots)')}
    expected = json.loads((FIXTURES / 'manifest.json').read_text())['pre_state']['runs']
    async with SqliteStepStore(database=database) as store:
        for run in expected:
            record = await store.get_run(run['run_id'])
            assert record is not None
            assert (record.agent_name, record.conversation_id, record.registration_id) == (
                run['agent_name'],
                run['conversation_id'],
                None,
            )
            snapshots = await store.list_snapshots(run['run_id'])
            assert [s.state.value for s in snapshots] == ['complete'] * run['snapshot_count']
            assert [s.step_index for s in snapshots] == run['snapshot_step_indexes']
            assert [len(s.messages) for s in snapshots] == run['message_counts']
            assert [e.kind.value for e in await store.list_events(run['run_id'])] == run['event_kinds']
            effects = await store.list_tool_effects(run['run_id'])
            assert [{'tool_call_id': e.tool_call_id, 'status': e.status.value} for e in effects] == run['tool_effects']
        assert await continue_run(store, run_id='fx-legacy-second')


async def test_stores_opening_it_at_once_migrate_it_once(tmp_path: Path) -> None:
    database = _copy(tmp_path, 'harness.db')
    stores = [SqliteStepStore(database=database) for _ in range(3)]
    try:
        found = await asyncio.gather(*(s.list_runs() for s in stores))
    finally:
        for store in stores:
            await store.aclose()
    assert [len(runs) for runs in found] == [11, 11, 11]
    assert [p.name for p in tmp_path.iterdir() if 'backup' in p.name] == ['runs.db.harness-backup']


async def test_a_damaged_record_is_left_out_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    database = _copy(tmp_path, 'harness.db')
    with sqlite3.connect(database) as conn:
        (seq,) = conn.execute("SELECT max(seq) FROM snapshots WHERE run_id = 'fx-finished'").fetchone()
        conn.execute('UPDATE snapshots SET messages = \'[{"kind": "nonsense"}]\' WHERE seq = ?', (seq,))
    with caplog.at_level(logging.WARNING):
        async with SqliteStepStore(database=database) as store:
            assert len(await store.list_snapshots('fx-finished')) == 1
            assert len(await store.list_runs()) == 11
    named = f"snapshot seq={seq} of run 'fx-finished' cannot be read, so it is not imported"
    assert any(named in r.getMessage() and r.name == 'stepcore.harness' for r in caplog.records)
    assert any(named in r.getMessage() and 'still in the backup' in r.getMessage() for r in caplog.records)


async def test_a_database_it_cannot_back_up_is_refused_with_the_import_command(tmp_path: Path) -> None:
    memory = sqlite3.connect(':memory:', check_same_thread=False)
    with sqlite3.connect(FIXTURES / 'harness.db') as fixture:
        fixture.backup(memory)
    async with SqliteStepStore(connection=memory) as store:
        with pytest.raises(ValueError, match=r'no file to write a backup beside.*stepcore import --from-harness'):
            await store.list_runs()
    assert is_harness_sqlite(memory)
    memory.close()

    database = _copy(tmp_path, 'harness.db')
    shared = sqlite3.connect(database, check_same_thread=False, isolation_level=None)
    shared.execute('BEGIN')
    shared.execute('SELECT count(*) FROM runs').fetchone()
    async with SqliteStepStore(connection=shared) as store:
        with pytest.raises(ValueError, match=r'transaction open.*stepcore import --from-harness'):
            await store.list_runs()
    shared.rollback()
    assert is_harness_sqlite(shared)
    shared.close()
    assert not (tmp_path / 'runs.db.harness-backup').exists()


async def test_a_database_with_tables_in_the_way_is_left_as_it_is(tmp_path: Path) -> None:
    database = _copy(tmp_path, 'harness.db')
    with sqlite3.connect(database) as conn:
        conn.execute('CREATE TABLE harness_runs (note TEXT)')
    original = _dump(database)
    store = SqliteStepStore(database=database)
    with pytest.raises(ValueError, match=r'harness_runs, where its tables would go.*stepcore import --from-harness'):
        await store.list_runs()
    await store.aclose()
    assert _dump(database) == original
    assert not [p for p in tmp_path.iterdir() if 'backup' in p.name]


async def test_other_stores_on_a_harness_file_say_what_to_do(tmp_path: Path) -> None:
    database = _copy(tmp_path, 'harness.db')
    media = SqliteMediaStore(database=database)
    with pytest.raises(ValueError, match=r'written by pydantic-ai-harness: open it with SqliteStepStore'):
        await media.exists('media+sha256://' + '0' * 64)
    await media.aclose()
    async with SqliteStepStore(database=database) as store:
        await store.list_runs()
    heads = SqliteConversationStore(database=database)
    with pytest.raises(ValueError, match='pydantic-ai-harness conversation heads, which stepcore does not migrate'):
        await heads.listing()
    await heads.aclose()


CRASH_CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    import stepcore.engine._engine_store as engine_store
    import step_sqlite.harness as harness
    from step_sqlite import SqliteStepStore

    point = sys.argv[2]
    if point == 'after-backup':
        write_backup = harness.write_backup
        def stop_after_backup(*args, **kwargs):
            write_backup(*args, **kwargs)
            os._exit(9)
        harness.write_backup = stop_after_backup
    elif point == 'mid-copy':
        save = engine_store.EngineStore.save_snapshot
        saved = 0
        async def stop_mid_copy(self, snapshot):
            global saved
            saved += 1
            if saved == 7:
                os._exit(9)
            await save(self, snapshot)
        engine_store.EngineStore.save_snapshot = stop_mid_copy
    else:
        migrate = harness._migrate
        def stop_before_commit(*args, **kwargs):
            migrate(*args, **kwargs)
            os._exit(9)
        harness._migrate = stop_before_commit

    async def main():
        async with SqliteStepStore(database=sys.argv[1]) as store:
            await store.list_runs()

    asyncio.run(main())
    """
)


@pytest.mark.parametrize('point', ['after-backup', 'mid-copy', 'before-commit'])
async def test_a_migration_killed_midway_leaves_the_harness_database_and_the_backup(point: str, tmp_path: Path) -> None:
    database = _copy(tmp_path, 'harness.db')
    original = _dump(database)
    child = await asyncio.create_subprocess_exec(
        sys.executable, '-c', CRASH_CHILD, str(database), point, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await child.communicate()
    assert child.returncode == 9, stderr.decode()
    backup = tmp_path / 'runs.db.harness-backup'
    assert _dump(backup) == original
    assert _dump(database) == original  # the migration's transaction never committed
    async with SqliteStepStore(database=database) as store:
        assert len(await store.list_runs()) == 11
        assert len(await _all_snapshots(store, 'fx-crashed')) == 5
        assert len(await store.list_events('fx-crashed')) == 8
    assert _dump(backup) == original
    assert _dump(tmp_path / 'runs.db.harness-backup.1') == original
