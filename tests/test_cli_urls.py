"""Store URLs on the command line mean what they mean to `stepcore.open_store`.

The data is written through `stepcore.open_store(url)` and read back by the `stepcore` command
given the same URL string. A third-party backend is installed the way pip would leave it: a
distribution's metadata on the path with an entry point in the `stepcore` group, seen by a child
process (the registry of this process is already loaded).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

import stepcore
from stepcore import StepPersistence
from stepcore.cli import main

PLUGIN = '''
"""A third-party backend: runs in a folder, opened by json:// URLs (key `json`) or by key only (`jsonkey`)."""

from stepcore import BackendInfo, hookimpl
from stepcore.plugins.urls import local_path, query_options


def json_url_options(url):
    return {'directory': local_path(url, what='folder', example='json:///path/to/runs'), **query_options(url)}


@hookimpl
def register_step_stores():
    return [
        BackendInfo(
            key='json',
            factory='step_file.store:FileStepStore',
            schemes=('json',),
            url_options=json_url_options,
            summary='Runs in a folder (a test plugin).',
        ),
        BackendInfo(key='jsonkey', factory='step_file.store:FileStepStore', summary='The same, by key only.'),
    ]
'''


async def _write_run(url: str, run_id: str) -> None:
    store = stepcore.open_store(url)
    try:
        agent = Agent(TestModel(), capabilities=[StepPersistence(store=store, run_id=run_id)])
        await agent.run(f'hello from {run_id}')
    finally:
        await store.aclose()


def _stepcore(*args: str, cwd: Path, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != 'STEPCORE_STORE'}
    env['COLUMNS'] = '200'
    if path is not None:
        env['PYTHONPATH'] = os.pathsep.join([str(path), *filter(None, [env.get('PYTHONPATH')])])
    return subprocess.run(
        [sys.executable, '-m', 'stepcore.cli', *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def _python(code: str, *, cwd: Path, path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(path), *filter(None, [os.environ.get('PYTHONPATH')])])}
    return subprocess.run(
        [sys.executable, '-c', code], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=300
    )


def _main(*args: str) -> tuple[int, str, str]:
    """`stepcore ARGS...` in this process, as the console script runs it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, 'argv', ['stepcore', *args])
        patch.delenv('STEPCORE_STORE', raising=False)
        out, err = io.StringIO(), io.StringIO()
        patch.setattr(sys, 'stdout', out)
        patch.setattr(sys, 'stderr', err)
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    'form',
    ['sqlite:///runs.db', 'sqlite:///{abs}/runs.db', 'file:runs', 'file://runs', 'file://{abs}/runs'],
)
def test_the_cli_reads_what_open_store_wrote_through_the_same_url(
    form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = form.format(abs=tmp_path)
    monkeypatch.chdir(tmp_path)
    anyio.run(_write_run, url, 'written')
    code, out, err = _main('--store', url, 'runs', '--json')
    assert code == 0, err
    assert [r['run_id'] for r in json.loads(out)] == ['written']


@pytest.fixture(scope='module')
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding an installed plugin distribution: its module and its `.dist-info`."""
    root = tmp_path_factory.mktemp('site')
    (root / 'stepcore_json_example.py').write_text(textwrap.dedent(PLUGIN), encoding='utf-8')
    info = root / 'stepcore_json_example-0.1.0.dist-info'
    info.mkdir()
    (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: stepcore-json-example\nVersion: 0.1.0\n')
    (info / 'entry_points.txt').write_text('[stepcore]\njson = stepcore_json_example\n')
    return root


def test_a_plugins_url_passes_its_path_to_the_store_in_the_cli_and_in_open_store(
    plugin_path: Path, tmp_path: Path
) -> None:
    runs = tmp_path / 'runs'
    anyio.run(_write_run, f'file://{runs}', 'kept')
    url = f'json://{runs}'

    listed = _stepcore('--store', url, 'runs', '--json', cwd=tmp_path, path=plugin_path)
    assert listed.returncode == 0, listed.stderr
    assert [r['run_id'] for r in json.loads(listed.stdout)] == ['kept']

    opened = _python(
        'import stepcore; s = stepcore.open_store(' + repr(url) + '); print(type(s).__name__, s.directory)',
        cwd=tmp_path,
        path=plugin_path,
    )
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.split() == ['FileStepStore', str(runs)]

    plugins = _stepcore('plugins', '--json', cwd=tmp_path, path=plugin_path)
    [ours] = [p for p in json.loads(plugins.stdout) if p['distribution'] == 'stepcore-json-example']
    assert [(b['key'], b['urls']) for b in ours['backends']] == [('json', ['json://']), ('jsonkey', ['jsonkey://'])]


def test_a_missing_folder_named_by_a_plugins_url_is_reported_not_created(plugin_path: Path, tmp_path: Path) -> None:
    done = _stepcore('--store', f'json://{tmp_path}/nowhere', 'runs', cwd=tmp_path, path=plugin_path)
    assert done.returncode == 1
    assert f"no json store at {tmp_path}/nowhere: 'json://{tmp_path}/nowhere' does not exist" in done.stderr
    assert not (tmp_path / 'nowhere').exists()


def test_a_key_url_with_a_path_is_refused_alike_by_the_cli_and_open_store(plugin_path: Path, tmp_path: Path) -> None:
    url = f'jsonkey://{tmp_path}/runs'
    expected = f"store URL '{url}' names step store backend 'jsonkey' by its key, so only its query string is read"
    done = _stepcore('--store', url, 'runs', cwd=tmp_path, path=plugin_path)
    assert done.returncode == 1
    assert expected in ' '.join(done.stderr.split())
    opened = _python(f'import stepcore; stepcore.open_store({url!r})', cwd=tmp_path, path=plugin_path)
    assert opened.returncode == 1
    assert f'ValueError: {expected}' in opened.stderr
    assert f"'{tmp_path}/runs' would be ignored" in opened.stderr


def test_a_key_url_takes_its_options_from_the_query(plugin_path: Path, tmp_path: Path) -> None:
    runs = tmp_path / 'runs'
    anyio.run(_write_run, f'file://{runs}', 'by-key')
    done = _stepcore('--store', f'jsonkey://?directory={runs}', 'runs', '--json', cwd=tmp_path, path=plugin_path)
    assert done.returncode == 0, done.stderr
    assert [r['run_id'] for r in json.loads(done.stdout)] == ['by-key']
