"""Real processes sharing one FileStepStore directory lose nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio.to_thread

from step_file import FileStepStore

WORKER = Path(__file__).with_name('file_worker.py')
STEPS = 30
TAGS = ('left', 'right')


def _run_workers(directory: Path) -> list[str]:
    """Start one worker per tag at once and return their outputs, in tag order."""
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(directory), tag, str(STEPS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in TAGS
    ]
    outputs: list[str] = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        outputs.append(out.strip())
    return outputs


async def test_processes_sharing_a_directory(tmp_path: Path) -> None:
    outputs = await anyio.to_thread.run_sync(_run_workers, tmp_path)
    store = FileStepStore(tmp_path)

    # Racing registrations of one run id: exactly one wins, and run.json is its record.
    assert sorted(outputs) == ['duplicate', 'ok']
    contested = await store.get_run('contested')
    assert contested is not None
    assert contested.registration_id == TAGS[outputs.index('ok')]
    assert [p.name for p in (tmp_path / 'contested').iterdir() if p.name.endswith('.tmp')] == []

    # Two processes appending to one run: unique, gapless seqs; each writer's events all there, in order.
    shared = await store.list_events('shared')
    assert [e.seq for e in shared] == list(range(1, 2 * STEPS + 1))
    for tag in TAGS:
        mine = [e.tool_call_id for e in shared if (e.tool_call_id or '').startswith(tag)]
        assert mine == [f'{tag}-{n}' for n in range(STEPS)], f'{tag} lost or reordered events'

    # Each process's own run is complete.
    assert sorted(r.run_id for r in await store.list_runs(conversation_id='shared')) == ['run-left', 'run-right']
    for tag in TAGS:
        run_id = f'run-{tag}'
        assert [e.seq for e in await store.list_events(run_id)] == list(range(1, STEPS + 1))
        assert len(await store.list_tool_effects(run_id)) == STEPS
        snapshots = await store.list_snapshots(run_id, include_interrupted=True)
        assert [s.seq for s in snapshots] == list(range(1, STEPS + 1))
        assert [len(s.messages) for s in snapshots] == [3 + 2 * n for n in range(STEPS)]
        assert len((tmp_path / run_id / 'messages.jsonl').read_text().splitlines()) == 1 + 2 * STEPS
