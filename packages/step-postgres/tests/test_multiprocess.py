"""Several processes writing different runs into one database at the same time lose nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from step_postgres import PostgresStepStore
from stepcore_conformance.support import check_tool_steps

STEPS = 15

WRITER = """
import asyncio, sys
from pathlib import Path
from step_postgres import PostgresStepStore
from stepcore_conformance.support import write_tool_steps

url, prefix, go, run_id, steps = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])

async def main():
    store = PostgresStepStore(dsn=url, table_prefix=prefix)
    await store.list_runs()  # connect and set up the schema before the start signal
    Path(f'{go}.{run_id}.ready').write_text('')
    while not go.exists():
        await asyncio.sleep(0.005)
    await write_tool_steps(store, run_id, steps, conversation_id='conv', snapshot_keys=True)
    await store.aclose()
    print('done', run_id)

asyncio.run(main())
"""


def _run_writers(postgres_url: str, table_prefix: str, go: Path, writers: list[str]) -> None:
    """Start one writer process per run, release them together, and wait for all of them."""
    procs = [
        subprocess.Popen(
            [sys.executable, '-c', WRITER, postgres_url, table_prefix, str(go), run_id, str(STEPS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run_id in writers
    ]
    try:
        deadline = time.monotonic() + 120
        while not all(Path(f'{go}.{run_id}.ready').exists() for run_id in writers):
            assert time.monotonic() < deadline, 'writers did not start'
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        go.write_text('go')
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            assert out.startswith('done')
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


async def test_processes_writing_different_runs_concurrently_lose_nothing(
    postgres_url: str, table_prefix: str, tmp_path: Path
) -> None:
    writers = ['w1', 'w2', 'w3']
    await asyncio.to_thread(_run_writers, postgres_url, table_prefix, tmp_path / 'go', writers)
    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    try:
        assert sorted(r.run_id for r in await store.list_runs(conversation_id='conv')) == writers
        for run_id in writers:
            await check_tool_steps(store, run_id, STEPS)
            assert [s.seq for s in await store.list_snapshots(run_id, include_interrupted=True)] == list(
                range(1, STEPS + 1)
            )
    finally:
        await store.aclose()
