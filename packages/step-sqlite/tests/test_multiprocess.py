"""Several processes writing one SQLite database at the same time lose nothing."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from step_sqlite import SqliteStepStore
from stepcore_conformance.support import check_tool_steps

STEPS = 30

WRITER = """
import asyncio, sys, time
from pathlib import Path
from step_sqlite import SqliteStepStore
from stepcore_conformance.support import write_tool_steps

database, go, run_id, conversation, steps = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])

async def main():
    store = SqliteStepStore(database=database)
    await store.list_runs()  # open and set up the schema before the start signal
    print('ready', flush=True)
    while not go.exists():
        time.sleep(0.005)
    await write_tool_steps(store, run_id, steps, conversation_id=conversation or None)
    await store.aclose()
    print('done', run_id)

asyncio.run(main())
"""


async def test_processes_writing_different_runs_concurrently_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    go = tmp_path / 'go'
    writers = {'solo': '', 'turn-1': 'conv', 'turn-2': 'conv'}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            '-c',
            WRITER,
            str(db),
            str(go),
            run_id,
            conversation,
            str(STEPS),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for run_id, conversation in writers.items()
    ]
    for proc in procs:  # every writer has its store open before any of them writes
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 120) == b'ready\n'
    go.write_text('go')
    for proc in procs:
        out, err = await asyncio.wait_for(proc.communicate(), 300)
        assert proc.returncode == 0, err.decode()
        assert out.startswith(b'done')

    await _check(db, writers)


async def _check(db: Path, writers: dict[str, str]) -> None:
    store = SqliteStepStore(database=db)
    try:
        assert sorted(r.run_id for r in await store.list_runs()) == sorted(writers)
        assert sorted(r.run_id for r in await store.list_runs(conversation_id='conv')) == ['turn-1', 'turn-2']
        for run_id in writers:
            await check_tool_steps(store, run_id, STEPS)
    finally:
        await store.aclose()
