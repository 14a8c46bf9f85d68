"""Who held a run, as the command line tells it: `show`, `events`, `recover` and `job` print the
ownership history a run's lease keeps (taken, taken over, handed on, writes refused) and the links
between a run and its resumption, both ways; `--json` gains it as new fields.

The store is the demo's: its report run is killed inside a tool, taken over by recovery and handed
to a resumption; a write of its first owner is then refused by the store.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from step_sqlite import SqliteStepStore
from stepcore import EventKind, RunFencedError, StepEvent
from stepcore.cli import app
from stepcore.cli.demo import run_demo
from stepcore.store.leases import Fence, fencing

runner = CliRunner()
_BORDERS = str.maketrans({c: ' ' for c in '│┃┏┓┗┛┡┩└┘┳┻╇╈┼━─┯┷┠┨'})


def said(*args: str) -> str:
    result = runner.invoke(app, list(args), env={'COLUMNS': '200', 'NO_COLOR': '1'})
    assert result.exit_code in (0, 4), (result.stdout, result.stderr)
    return ' '.join(result.stdout.translate(_BORDERS).split())


def as_json(*args: str) -> Any:
    result = runner.invoke(app, [*args, '--json'], env={'COLUMNS': '200'})
    assert result.exit_code in (0, 4), (result.stdout, result.stderr)
    return json.loads(result.stdout)


async def _refuse_a_zombie_write(database: Path) -> None:
    store = SqliteStepStore(database=str(database))
    try:
        with fencing(Fence('report-run-1', 1)), pytest.raises(RunFencedError):
            await store.append_event(StepEvent(run_id='report-run-1', kind=EventKind.TOOL_CALL_COMPLETED, step_index=9))
    finally:
        await store.aclose()


@pytest.fixture(scope='module')
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    database = tmp_path_factory.mktemp('ownership') / 'demo.db'
    run_demo(database, console=Console(file=io.StringIO()))
    asyncio.run(_refuse_a_zombie_write(database))
    resumption = as_json('recover', 'report-run-1', '-s', f'sqlite:///{database}')['ownership']['resumed_by']
    assert resumption
    return f'sqlite:///{database}', resumption


def test_recover_tells_who_held_the_run_and_who_took_it_over(demo: tuple[str, str]) -> None:
    url, resumption = demo
    text = said('recover', 'report-run-1', '-s', url)
    me = socket.gethostname()
    assert f'resumed by run {resumption} on {me} pid ' in text
    assert 'lease_taken taken by ' in text
    assert 'lease_taken_over taken over by ' in text
    assert '(recovering it) from ' in text
    assert 'at epoch 1, now epoch 2 (owner gone)' in text
    assert f'lease_handed_on handed to its resumption {resumption}' in text
    assert 'write_refused write refused: ' in text
    assert 'still held epoch 1 (the run is at epoch 3)' in text
    data = as_json('recover', 'report-run-1', '-s', url)['ownership']
    assert [c['kind'] for c in data['history']] == [
        'lease_taken',
        'lease_taken_over',
        'lease_handed_on',
        'write_refused',
    ]
    assert data['history'][1]['previous'].endswith('at epoch 1')
    assert data['resumed_by'] == resumption


def test_the_resumption_links_back_and_show_and_events_tell_the_history(demo: tuple[str, str]) -> None:
    url, resumption = demo
    back = said('recover', resumption, '-s', url)
    assert 'resumes run report-run-1 (stepcore job report-run-1)' in back
    assert 'lease_taken taken by ' in back
    assert 'resumes run report-run-1)' in back  # the change says which run it resumes
    events = said('events', 'report-run-1', '-s', url)
    assert 'lease_taken_over' in events
    assert 'write_refused' in events
    shown = said('show', 'report-run-1', '-s', url)
    assert 'lease_handed_on' in shown
    snapshot = as_json('show', 'report-run-1', '-s', url)
    assert snapshot['ownership']['history'][0]['kind'] == 'lease_taken'
    assert 'messages' in snapshot, 'the snapshot fields are kept'


def test_job_shows_each_run_with_who_held_it(demo: tuple[str, str]) -> None:
    url, resumption = demo
    text = said('job', 'report-run-1', '-s', url)
    assert 'run report-run-1 (' in text
    assert f'run {resumption} (completed)' in text
    assert 'lease_taken_over' in text
    assert 'write_refused' in text
    data = as_json('job', 'report-run-1', '-s', url)
    first, second = data['runs']
    assert [c['kind'] for c in first['ownership']['history']][-1] == 'write_refused'
    assert second['ownership']['resumes'] == 'report-run-1'
    assert [c['kind'] for c in second['ownership']['history']] == ['lease_taken', 'lease_released']
