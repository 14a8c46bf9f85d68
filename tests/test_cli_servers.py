"""The CLI over the server backends: runs exported from SQLite, imported into MongoDB and PostgreSQL.

Needs the servers `scripts/test.sh` starts: `STEP_MONGO_URL` and `STEP_POSTGRES_URL` (for example
`export STEP_MONGO_URL="$(scripts/mongo-server.sh start)"`).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel
from typer.testing import CliRunner

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence
from stepcore.cli import app
from stepcore.cli._loop import run_coroutine

runner = CliRunner()


def _server(variable: str, script: str) -> str:
    url = os.environ.get(variable, '').strip()
    if not url:
        pytest.fail(f'{variable} is not set: start a server with `export {variable}="$(scripts/{script} start)"`')
    return url


def _ok(*args: str) -> str:
    result = runner.invoke(app, list(args), env={'COLUMNS': '200'})
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


async def _orchestrate(database: Path, tag: str) -> None:
    store = SqliteStepStore(database=database)
    orchestrator = Agent(TestModel(), name='orchestrator', capabilities=[StepPersistence(store=store)])
    helper = Agent(TestModel(), name='helper', capabilities=[StepPersistence(store=store)])

    @orchestrator.tool_plain
    async def delegate(question: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return (await helper.run(question, run_id=f'{tag}-helper')).output

    try:
        await orchestrator.run('plan the week', run_id=f'{tag}-root', conversation_id=f'{tag}-conv')
    finally:
        await store.aclose()


def _without_seq(doc: dict[str, Any]) -> dict[str, Any]:
    copy = json.loads(json.dumps(doc))
    for run in copy['runs']:
        for item in (*run['events'], *run['snapshots']):
            item.pop('seq', None)
    return copy


def _round_trip(target: str, tmp_path: Path) -> None:
    tag = f'cli-{uuid.uuid4().hex[:10]}'
    database = tmp_path / 'source.db'
    run_coroutine(_orchestrate(database, tag))
    source = f'sqlite:///{database}'
    exported = tmp_path / 'export.json'
    _ok('export', f'{tag}-root', '--with-delegates', '-s', source, '-o', str(exported))
    result = runner.invoke(app, ['import', str(exported), '-s', target])
    assert result.exit_code == 0, result.stderr

    assert [r['run_id'] for r in json.loads(_ok('runs', '--conversation', f'{tag}-conv', '-s', target, '--json'))] == [
        f'{tag}-root'
    ]
    tree = json.loads(_ok('tree', f'{tag}-root', '-s', target, '--json'))
    assert [(c['run_id'], c['status']) for c in tree['children']] == [(f'{tag}-helper', 'completed')]
    assert 'delegate' in _ok('show', f'{tag}-root', '-s', target)
    again = json.loads(_ok('export', f'{tag}-root', '--with-delegates', '-s', target))
    assert _without_seq(again) == _without_seq(json.loads(exported.read_text()))


def test_mongo_store_url(tmp_path: Path) -> None:
    url = _server('STEP_MONGO_URL', 'mongo-server.sh').rstrip('/')
    _round_trip(f'{url}/stepcore_cli', tmp_path)


def test_postgres_store_url(tmp_path: Path) -> None:
    _round_trip(_server('STEP_POSTGRES_URL', 'postgres-server.sh'), tmp_path)
