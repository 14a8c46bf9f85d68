"""The README's install works as typed, both ways it shows, in a fresh virtual environment.

The commands are read from the README's first install block, so the test and the README cannot
drift apart: `uv venv .venv && . .venv/bin/activate` then `uv pip install <paths>`, and the plain
route the README describes beside it, `python -m venv .venv` then `pip install <the same paths>`.
Each environment then imports the core and the SQLite store, lists the SQLite backend, and runs a
persisted agent.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import asyncio
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel
from step_sqlite import SqliteStepStore
from stepcore import StepPersistence

async def main():
    async with SqliteStepStore(database='runs.db') as store:
        agent = Agent(TestModel(), capabilities=[StepPersistence(store=store, run_id='installed')])
        await agent.run('hello')
        print([event.kind.value for event in await store.list_events('installed')][-1])

asyncio.run(main())
"""


def _install_block() -> list[str]:
    """The lines of the README's first bash block under `## Install`, comments dropped."""
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    section = readme.split('## Install', 1)[1]
    block = re.search(r'```bash\n(.*?)```', section, re.S)
    assert block is not None, 'the README has no install commands'
    return [line.split('  #', 1)[0].strip() for line in block[1].splitlines() if line.strip()]


def _run(args: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, check=False, **kwargs)  # type: ignore[call-overload]


def _env(venv: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(('PYTEST_', 'VIRTUAL_ENV'))}
    env['VIRTUAL_ENV'] = str(venv)  # what `. .venv/bin/activate` sets
    env['PATH'] = f'{venv / "bin"}{os.pathsep}{env.get("PATH", "")}'
    return env


def _check(venv: Path, env: dict[str, str], work: Path) -> None:
    listed = _run([venv / 'bin' / 'stepcore', 'plugins', '--json'], env=env, cwd=work)
    assert listed.returncode == 0, listed.stderr
    keys = {(backend['kind'], backend['key']) for row in json.loads(listed.stdout) for backend in row['backends']}
    assert ('step', 'sqlite') in keys, keys
    ran = _run([venv / 'bin' / 'python', '-c', SCRIPT], env=env, cwd=work)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == 'run_completed', ran.stdout


@pytest.fixture(scope='module')
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workspace's pins, so the fresh environments get the versions the suite tests."""
    pins = tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['uv']['constraint-dependencies']
    path = tmp_path_factory.mktemp('pins') / 'constraints.txt'
    path.write_text('\n'.join(pins) + '\n')
    return path


def test_the_readme_install_with_uv(tmp_path: Path, constraints: Path) -> None:
    lines = _install_block()
    assert 'uv venv .venv && . .venv/bin/activate' in lines, lines
    install = next(line for line in lines if line.startswith('uv pip install '))
    uv = _run(['bash', ROOT / 'scripts' / 'ensure-uv.sh']).stdout.strip()
    venv = tmp_path / '.venv'
    env = _env(venv)
    made = _run([uv, 'venv', '--quiet', '--python', sys.executable, venv], env=env, cwd=ROOT)
    assert made.returncode == 0, made.stderr
    args = shlex.split(install)[1:]  # `pip install <paths>`, given to uv
    installed = _run([uv, *args, '--quiet', '-c', constraints], env=env, cwd=ROOT)
    assert installed.returncode == 0, installed.stderr
    assert not (venv / 'bin' / 'pip').exists(), 'a uv environment has no pip: the README says to use uv pip'
    _check(venv, env, tmp_path)


def test_the_readme_install_with_venv_and_pip(tmp_path: Path, constraints: Path) -> None:
    lines = _install_block()
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    assert 'python -m venv .venv' in readme
    install = next(line for line in lines if line.startswith('uv pip install '))
    venv = tmp_path / '.venv'
    made = _run([sys.executable, '-m', 'venv', venv], cwd=ROOT)
    assert made.returncode == 0, made.stderr
    env = _env(venv)
    args = shlex.split(install)[2:]  # `install <paths>`, given to the environment's own pip
    installed = _run(
        [venv / 'bin' / 'pip', *args, '--quiet', '--disable-pip-version-check', '-c', constraints], env=env, cwd=ROOT
    )
    assert installed.returncode == 0, installed.stderr
    _check(venv, env, tmp_path)
