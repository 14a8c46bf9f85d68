"""`stepcore check` and `check_store`: a whole store read back, damage listed by run, exit status for scripts."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel
from typer.testing import CliRunner

from step_file import FileStepStore
from step_sqlite import SqliteStepStore
from stepcore import StepPersistence, check_store
from stepcore.cli import app


async def _two_runs(store: SqliteStepStore | FileStepStore) -> list[str]:
    agent = Agent(TestModel(), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def lookup(word: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'{word}: found'

    await agent.run('look it up')
    await agent.run('again')
    runs = sorted(run.run_id for run in await store.list_runs())
    await store.aclose()
    return runs


def test_a_sound_store_checks_clean_and_exits_0(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    runs = asyncio.run(_two_runs(SqliteStepStore(database=db)))
    report = asyncio.run(check_store(SqliteStepStore(database=db)))
    assert report.ok
    assert report.runs == 2
    assert report.integrity == []  # SQLite's own check ran and found nothing
    result = CliRunner().invoke(app, ['--store', f'sqlite:///{db}', 'check'])
    assert result.exit_code == 0, result.output
    assert 'integrity check: ok' in result.stdout
    assert '2 run(s) read: no damage found' in result.stdout
    assert runs


def test_a_damaged_record_is_listed_under_its_run_and_exits_1(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    runs = asyncio.run(_two_runs(SqliteStepStore(database=db)))
    with sqlite3.connect(db) as connection:  # alter one event's body: its checksum no longer holds
        connection.execute(
            "UPDATE events SET record = replace(record, 'model_request_started', 'model_request_startee') "
            'WHERE run_id = ? AND seq = 2',
            (runs[0],),
        )
    connection.close()
    result = CliRunner().invoke(app, ['--store', f'sqlite:///{db}', 'check', '--json'])
    assert result.exit_code == 1, result.output
    found = json.loads(result.stdout)
    assert found['ok'] is False
    assert list(found['damaged']) == [runs[0]]
    (line,) = found['damaged'][runs[0]]
    assert line.startswith('events: ')
    assert 'checksum' in line
    plain = CliRunner().invoke(app, ['--store', f'sqlite:///{db}', 'check'])
    assert plain.exit_code == 1
    assert f'run {runs[0]}: 1 damaged' in plain.stdout
    assert 'damage found in 1 run(s)' in plain.stdout


def test_a_file_store_has_no_check_of_its_own_and_its_records_are_read(tmp_path: Path) -> None:
    folder = tmp_path / 'runs'
    runs = asyncio.run(_two_runs(FileStepStore(folder)))
    report = asyncio.run(check_store(FileStepStore(folder)))
    assert report.ok
    assert report.integrity is None
    assert report.runs == len(runs)
    result = CliRunner().invoke(app, ['--store', f'file://{folder}', 'check'])
    assert result.exit_code == 0, result.output
    assert 'integrity check: this backend has none of its own' in result.stdout


def test_a_record_the_backend_passes_over_with_its_own_warning_is_listed(tmp_path: Path) -> None:
    folder = tmp_path / 'runs'
    runs = asyncio.run(_two_runs(FileStepStore(folder)))
    messages = folder / runs[0] / 'messages.jsonl'
    lines = messages.read_bytes().splitlines(keepends=True)
    messages.write_bytes(b''.join(lines[:-1]))  # the newest snapshot's head node is gone
    report = asyncio.run(check_store(FileStepStore(folder)))
    assert not report.ok
    assert list(report.damaged) == [runs[0]]
    assert any(line.startswith('snapshots: step_file: passing over snapshot') for line in report.damaged[runs[0]])
