"""The entry point is installed: stepcore finds the `template` backend by its key and by its URLs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from stepcore_template import TemplateStepStore

import stepcore
from stepcore import RunRecord
from stepcore.plugins.registry import get_registry

STEPCORE = str(Path(sys.executable).parent / 'stepcore')
"""The command line, as installed beside this interpreter."""


async def test_from_spec_builds_the_store(tmp_path: Path) -> None:
    store = stepcore.from_spec('template', directory=tmp_path / 'runs', max_snapshots_per_run=3)
    assert isinstance(store, TemplateStepStore)
    assert store.max_snapshots_per_run == 3
    await store.aclose()


def test_plugin_declares_what_the_class_declares() -> None:
    backend = get_registry().get('step', 'template')
    assert backend.distribution == 'stepcore-template'
    assert backend.features() == TemplateStepStore.features


async def test_the_command_line_lists_runs_another_process_wrote(tmp_path: Path) -> None:
    store = stepcore.open_store(f'template://{tmp_path}/runs')
    assert isinstance(store, TemplateStepStore)
    await store.register_run(RunRecord(run_id='r1', agent_name='librarian'))
    await store.aclose()
    command = [STEPCORE, '--store', f'template://{tmp_path}/runs', 'runs', '--json']
    listed = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, check=True)
    assert [run['run_id'] for run in json.loads(listed.stdout)] == ['r1']


def test_a_url_without_a_folder_says_what_to_write() -> None:
    command = [STEPCORE, '--store', 'template://', 'runs']
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode != 0
    assert 'template:///path/to/runs' in result.stderr
