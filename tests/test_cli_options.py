"""The command line's global options, run-id prefixes and help, through its entry point `stepcore.cli.main`.

The store is a real SQLite file filled by real agent runs (pydantic-ai's TestModel).
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

import stepcore
from stepcore import StepPersistence
from stepcore.cli import app, main

RUN_IDS = ['alpha', 'alpha-2', 'beta-1']


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """Run `stepcore ARGS...` in this process, as the console script does: `main()` with `sys.argv`."""
    monkeypatch.setenv('COLUMNS', '200')
    monkeypatch.delenv('STEPCORE_STORE', raising=False)

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(sys, 'argv', ['stepcore', *args])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        captured = capsys.readouterr()
        for name in env or {}:
            monkeypatch.delenv(name)
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture(scope='module')
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f'sqlite:///{tmp_path_factory.mktemp("cli") / "runs.db"}'

    async def fill() -> None:
        store = stepcore.open_store(url)
        try:
            for run_id in RUN_IDS:
                agent = Agent(TestModel(), capabilities=[StepPersistence(store=store, run_id=run_id)])
                await agent.run(f'hello from {run_id}')
        finally:
            await store.aclose()

    import anyio

    anyio.run(fill)
    return url


def _json(result: Result) -> Any:
    assert result.code == 0, result.err
    return json.loads(result.out)


# --- --version -------------------------------------------------------------------------------------


@pytest.mark.parametrize('module', ['stepcore', 'stepcore.cli'])
def test_version_names_stepcore_and_the_pydantic_ai_it_runs_with(module: str) -> None:
    done = subprocess.run(
        [sys.executable, '-m', module, '--version'], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pydantic_ai = importlib.metadata.version('pydantic-ai-slim')
    assert done.stdout.startswith(f'stepcore {stepcore.__version__} (pydantic-ai {pydantic_ai}, Python ')


def test_version_needs_no_store_and_no_command(cli: Any) -> None:
    result = cli('--version')
    assert result.code == 0
    assert result.out.startswith('stepcore ')


# --- a global --store ------------------------------------------------------------------------------


def test_store_before_the_command(cli: Any, db: str) -> None:
    assert [r['run_id'] for r in _json(cli('--store', db, 'runs', '--json'))] == RUN_IDS
    assert [r['run_id'] for r in _json(cli('-s', db, 'runs', '--json'))] == RUN_IDS
    events = _json(cli('-s', db, 'events', 'beta-1', '--json'))
    assert events[0]['kind'] == 'run_started'


def test_a_commands_own_store_wins_over_the_global_one(cli: Any, db: str, tmp_path: Path) -> None:
    missing = f'sqlite:///{tmp_path / "missing.db"}'
    assert len(_json(cli('--store', missing, 'runs', '--store', db, '--json'))) == 3
    refused = cli('--store', db, 'runs', '--store', missing)
    assert refused.code == 1
    assert 'missing.db' in refused.err
    assert 'does not exist' in refused.err


def test_the_global_store_wins_over_the_environment(cli: Any, db: str, tmp_path: Path) -> None:
    missing = f'sqlite:///{tmp_path / "missing.db"}'
    assert len(_json(cli('--store', db, 'runs', '--json', env={'STEPCORE_STORE': missing}))) == 3
    assert len(_json(cli('runs', '--json', env={'STEPCORE_STORE': db}))) == 3
    refused = cli('runs', env={'STEPCORE_STORE': missing})
    assert refused.code == 1
    assert 'missing.db' in refused.err


def test_without_any_store_the_error_says_how_to_give_one(cli: Any) -> None:
    result = cli('runs')
    assert result.code == 1
    assert 'no store given: pass --store URL or set STEPCORE_STORE' in result.err


def test_commands_without_a_store_accept_the_global_option(cli: Any, db: str) -> None:
    result = cli('--store', db, 'plugins', '--json')
    assert result.code == 0, result.err
    assert any(p['distribution'] == 'stepcore' for p in json.loads(result.out))


# --- run-id prefixes -------------------------------------------------------------------------------


def test_a_unique_prefix_names_the_run(cli: Any, db: str) -> None:
    events = _json(cli('-s', db, 'events', 'b', '--json'))
    assert {e['run_id'] for e in events} == {'beta-1'}
    assert 'events of beta-1' in cli('-s', db, 'events', 'bet').out
    assert _json(cli('-s', db, 'tree', 'alpha-', '--json'))['run_id'] == 'alpha-2'
    assert 'snapshots of alpha-2' in cli('-s', db, 'snapshots', 'alpha-').out
    assert 'hello from beta-1' in cli('-s', db, 'show', 'be').out
    assert cli('-s', db, 'effects', 'be').code == 0
    assert 'beta-1' in cli('-s', db, 'recover', 'be').out
    [exported] = _json(cli('-s', db, 'export', 'be'))['runs']
    assert exported['run']['run_id'] == 'beta-1'


def test_a_full_id_wins_over_the_ids_it_starts(cli: Any, db: str) -> None:
    events = _json(cli('-s', db, 'events', 'alpha', '--json'))
    assert {e['run_id'] for e in events} == {'alpha'}


def test_an_ambiguous_prefix_lists_the_candidates(cli: Any, db: str) -> None:
    result = cli('-s', db, 'show', 'alp')
    assert result.code == 1
    assert "run id prefix 'alp' is ambiguous: 2 runs start with it (alpha, alpha-2); give more of the id" in result.err


def test_an_unknown_run_says_so(cli: Any, db: str) -> None:
    result = cli('-s', db, 'tree', 'gamma')
    assert result.code == 1
    assert "run 'gamma' not found in this store, and no run id starts with it" in result.err


# --- help ------------------------------------------------------------------------------------------


def _help(cli: Any, *command: str) -> str:
    result = cli(*command, '--help')
    assert result.code == 0, result.err
    return result.out


def _after(text: str, option: str) -> list[str]:
    """The words after `option` on its line of a help text."""
    [line] = [line for line in text.splitlines() if f' {option} ' in line]
    return line.split(f' {option} ', 1)[1].split()


def test_flags_show_as_flags_in_every_commands_help(cli: Any) -> None:
    commands = sorted(typer.main.get_group(app).list_commands(None))  # pyright: ignore[reportArgumentType]
    for command in [(), *((name,) for name in commands)]:
        text = _help(cli, *command)
        assert '<bool>' not in text, f'stepcore {" ".join(command)} --help shows a flag as taking a value:\n{text}'
    runs = _help(cli, 'runs')
    assert _after(runs, '--json')[:2] == ['Print', 'JSON']
    assert _after(runs, '--limit')[:2] == ['<int', 'range>']
    assert _after(runs, '-s')[:2] == ['URL', 'Store']
    assert 'RUN' in _help(cli, 'events')
    root = _help(cli)
    assert _after(root, '--version')[:2] == ['Print', 'the']
    assert _after(root, '-s')[:2] == ['URL', 'Store']
