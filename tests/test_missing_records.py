"""Records missing from a run are told from the end of the run: every listing is checked against the
count of records kept with the run's lease, on SQLite, the file store and PostgreSQL.

Each test runs a real agent with `StepPersistence` (so the run has a lease and its count), then
removes records the way a damaged index loses them — rows gone from the backend's own tables or
lines gone from its files, the remaining ones intact — and reads the run through the public API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel
from typer.testing import CliRunner

from step_file import FileStepStore
from step_file.layout import EFFECTS_FILE, EVENTS_FILE, LEASE_FILE
from step_sqlite import SqliteStepStore
from stepcore import (
    DamagedRecordError,
    InMemoryStepStore,
    RunRecord,
    StepEvent,
    StepPersistence,
    StepStore,
    check_store,
)
from stepcore.cli import app
from stepcore.store.models import EventKind


async def _agent_run(store: StepStore, *, calls: int = 3) -> str:
    """One run of a real agent calling a tool `calls` times; its run id."""
    agent = Agent(TestModel(call_tools=['lookup']), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def lookup(word: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'{word}: found'

    for _ in range(calls - 1):
        await agent.run('look it up')
    await agent.run('look it up')
    runs = sorted(await store.list_runs(), key=lambda r: r.started_at)
    return runs[-1].run_id


def _sqlite(db: Path, statement: str, *args: object) -> None:
    with sqlite3.connect(db) as connection:
        connection.execute(statement, args)
    connection.close()


def _drop_last_lines(path: Path, count: int = 1) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b''.join(lines[:-count]))


async def _damaged(read: Callable[[], Awaitable[Any]], run_id: str, record: str) -> DamagedRecordError:
    with pytest.raises(DamagedRecordError) as caught:
        await read()
    assert caught.value.run_id == run_id
    assert caught.value.record == record
    assert 'records are missing' in str(caught.value)
    return caught.value


async def test_sqlite_events_missing_at_the_end_or_in_the_middle_raise(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db)
    run_id = await _agent_run(store)
    events = await store.list_events(run_id)
    newest = events[-1].seq
    await store.aclose()

    _sqlite(db, 'DELETE FROM events WHERE run_id = ? AND seq = ?', run_id, newest)
    store = SqliteStepStore(database=db)
    error = await _damaged(lambda: store.list_events(run_id), run_id, 'events')
    assert f'the run had {newest} events and the store lists up to seq {newest - 1}' in str(error)
    # a window that ends before the loss reads as before; one that reaches it raises
    assert [e.seq for e in await store.list_events_page(run_id, limit=2)] == [1, 2]
    await _damaged(lambda: store.list_events_page(run_id, limit=2, newest=True), run_id, 'events')
    await store.aclose()

    _sqlite(db, 'DELETE FROM events WHERE run_id = ? AND seq = 2', run_id)
    store = SqliteStepStore(database=db)
    error = await _damaged(lambda: store.list_events_page(run_id, after_seq=0, limit=3), run_id, 'events')
    assert 'event seq 2 is missing (the next found is 3)' in str(error)
    await store.aclose()


async def test_sqlite_a_lost_ledger_entry_snapshot_or_run_record_raises(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db)
    run_id = await _agent_run(store)
    effects = await store.list_tool_effects(run_id)
    snapshots = await store.list_snapshots(run_id, include_interrupted=True)
    assert effects
    assert len(snapshots) >= 2
    await store.aclose()

    _sqlite(db, 'DELETE FROM tool_effects WHERE run_id = ? AND tool_call_id = ?', run_id, effects[-1].tool_call_id)
    _sqlite(db, 'DELETE FROM snapshots WHERE run_id = ? AND seq = ?', run_id, snapshots[-1].seq)
    _sqlite(db, 'DELETE FROM runs WHERE run_id = ?', run_id)
    store = SqliteStepStore(database=db)
    await _damaged(lambda: store.list_tool_effects(run_id), run_id, 'ledger')
    await _damaged(lambda: store.list_unresolved_tool_effects(run_id), run_id, 'ledger')
    error = await _damaged(lambda: store.latest_snapshot(run_id), run_id, 'snapshots')
    assert f'seq {snapshots[-1].seq}' in str(error)  # never the older snapshot, taken for the newest
    await _damaged(lambda: store.list_snapshots(run_id, include_interrupted=True), run_id, 'snapshots')
    await _damaged(lambda: store.get_run(run_id), run_id, 'run')
    report = await check_store(store)
    assert not report.ok
    assert {line.split(':')[0] for line in report.damaged[run_id]} == {'run record', 'ledger', 'snapshots'}
    await store.aclose()


async def test_sqlite_an_older_snapshot_lost_raises_from_the_listing(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db)
    run_id = await _agent_run(store)
    snapshots = await store.list_snapshots(run_id, include_interrupted=True)
    await store.aclose()
    _sqlite(db, 'DELETE FROM snapshots WHERE run_id = ? AND seq = ?', run_id, snapshots[0].seq)
    store = SqliteStepStore(database=db)
    error = await _damaged(lambda: store.list_snapshots(run_id, include_interrupted=True), run_id, 'snapshots')
    assert f'the run had {len(snapshots)} snapshots and the store lists {len(snapshots) - 1}' in str(error)
    latest = await store.latest_snapshot(run_id, include_interrupted=True)  # the newest is there: read
    assert latest is not None
    assert latest.seq == snapshots[-1].seq
    await store.aclose()


async def test_file_store_lines_missing_from_its_logs_raise(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    run_id = await _agent_run(store)
    count = len(await store.list_events(run_id))
    last_call = (await store.list_tool_effects(run_id))[-1].tool_call_id
    await store.aclose()
    _drop_last_lines(tmp_path / run_id / EVENTS_FILE)
    ledger = tmp_path / run_id / EFFECTS_FILE  # every line of the newest call's entry
    kept = [line for line in ledger.read_bytes().splitlines(keepends=True) if last_call.encode() not in line]
    ledger.write_bytes(b''.join(kept))
    store = FileStepStore(tmp_path)
    error = await _damaged(lambda: store.list_events(run_id), run_id, 'events')
    assert f'the run had {count} events' in str(error)
    await _damaged(lambda: store.list_tool_effects(run_id), run_id, 'ledger')
    await store.aclose()


async def test_a_damaged_count_is_logged_and_the_run_reads_as_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStepStore(tmp_path)
    run_id = await _agent_run(store)
    before = await store.list_events(run_id)
    await store.aclose()
    lease = tmp_path / run_id / LEASE_FILE
    data = json.loads(lease.read_bytes())
    body = data['body'] if isinstance(data.get('body'), dict) else None
    if body is None:  # the lease file keeps its body as text
        body = json.loads(data['body'])
        body['tally']['e'] += 5
        data['body'] = json.dumps(body, separators=(',', ':'))
    else:
        body['tally']['e'] += 5
    lease.write_text(json.dumps(data, separators=(',', ':')))
    store = FileStepStore(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert await store.list_events(run_id) == before
    assert any('its count of records is damaged' in r.getMessage() for r in caplog.records)
    assert await store.counts_records(run_id) is False
    await store.aclose()


async def test_a_run_written_without_a_lease_reads_as_before_and_the_check_says_so(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db)
    counted = await _agent_run(store, calls=1)
    await store.register_run(RunRecord(run_id='by-hand'))
    for index in range(3):
        await store.append_event(StepEvent(run_id='by-hand', kind=EventKind.RUN_STARTED, step_index=index))
    await store.aclose()
    _sqlite(db, "DELETE FROM events WHERE run_id = 'by-hand' AND seq = 3")
    store = SqliteStepStore(database=db)
    assert [e.seq for e in await store.list_events('by-hand')] == [1, 2]  # cannot be told
    assert await store.counts_records('by-hand') is False
    assert await store.counts_records(counted) is True
    report = await check_store(store)
    assert report.ok
    assert report.uncounted == ['by-hand']
    await store.aclose()
    result = await asyncio.to_thread(CliRunner().invoke, app, ['--store', f'sqlite:///{db}', 'check'])
    assert result.exit_code == 0, result.output
    assert '1 run(s) without a count of their records' in result.stdout


@pytest.mark.skipif(not os.environ.get('STEP_POSTGRES_URL'), reason='STEP_POSTGRES_URL is not set')
async def test_postgres_rows_missing_from_a_run_raise() -> None:
    import psycopg
    from psycopg import sql

    from step_postgres import PostgresStepStore

    url = os.environ['STEP_POSTGRES_URL']
    prefix = f'missing_{uuid.uuid4().hex[:8]}'
    store = PostgresStepStore(dsn=url, table_prefix=prefix)
    try:
        run_id = await _agent_run(store)
        events = await store.list_events(run_id)
        snapshots = await store.list_snapshots(run_id, include_interrupted=True)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
            for table, seq in (('events', events[-1].seq), ('snapshots', snapshots[-1].seq)):
                await connection.execute(
                    sql.SQL('DELETE FROM {} WHERE run_id = %s AND seq = %s').format(
                        sql.Identifier(f'{prefix}_{table}')
                    ),
                    (run_id, seq),
                )
        await _damaged(lambda: store.list_events(run_id), run_id, 'events')
        await _damaged(lambda: store.latest_snapshot(run_id, include_interrupted=True), run_id, 'snapshots')
    finally:
        await store.aclose()


@pytest.mark.parametrize('backend', ['memory', 'sqlite'])
async def test_a_lease_swap_counts_the_ledger_and_snapshots_without_reading_them(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every lease swap (taking, renewing, letting go) stores the run's count of ledger entries; a store
    # that can count them answers the number, so a long run's renewal does not read every entry's body.
    db = tmp_path / 'runs.db'
    store: SqliteStepStore | InMemoryStepStore = (
        SqliteStepStore(database=db) if backend == 'sqlite' else InMemoryStepStore()
    )
    port = type(store.port)
    asked: list[tuple[bool, str | None]] = []
    summaries: list[bool] = []
    list_effects, snapshot_states = port.list_effects, port.snapshot_states

    def spied(self: Any, tx: Any, op: Any) -> Any:
        asked.append((op.count, op.tool_call_id))
        return list_effects(self, tx, op)

    def states_spied(self: Any, tx: Any, op: Any) -> Any:
        summaries.append(op.summary)
        return snapshot_states(self, tx, op)

    monkeypatch.setattr(port, 'list_effects', spied)
    monkeypatch.setattr(port, 'snapshot_states', states_spied)
    run_id = await _agent_run(store, calls=3)
    assert (True, None) in asked
    assert (False, None) not in asked  # no swap, nor anything else of the run, read the whole ledger
    assert summaries
    assert all(summaries)  # nor a row per snapshot: without retention nothing else lists their states

    entries = await store.list_tool_effects(run_id)
    assert len(entries) == 1
    assert asked[-1] == (False, None)  # a listing reads it whole, and checks it against the count
    if isinstance(store, SqliteStepStore):
        await store.aclose()
        _sqlite(db, 'DELETE FROM tool_effects WHERE run_id = ?', run_id)
        store = SqliteStepStore(database=db)
    else:
        store.port._data[run_id].effects.clear()  # pyright: ignore[reportPrivateUsage]
    error = await _damaged(lambda: store.list_tool_effects(run_id), run_id, 'ledger')
    assert 'the run had 1 ledger entries and the store lists 0' in str(error)
    snapshots = await store.list_snapshots(run_id, include_interrupted=True)
    if isinstance(store, SqliteStepStore):
        await store.aclose()
        _sqlite(db, 'DELETE FROM snapshots WHERE run_id = ? AND seq = ?', run_id, snapshots[0].seq)
        store = SqliteStepStore(database=db)
    else:
        del store.port._data[run_id].snapshots[0]  # pyright: ignore[reportPrivateUsage]
    error = await _damaged(lambda: store.list_snapshots(run_id, include_interrupted=True), run_id, 'snapshots')
    assert f'the run had {len(snapshots)} snapshots and the store lists {len(snapshots) - 1}' in str(error)
    await store.aclose()
