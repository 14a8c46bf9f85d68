"""Several processes writing different runs into one database at the same time lose nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from step_postgres import PostgresStepStore
from stepcore import EventKind, ToolEffectStatus

STEPS = 15

WRITER = """
import asyncio, sys, time
from pathlib import Path
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart
from step_postgres import PostgresStepStore
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus

url, prefix, go, run_id, steps = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])

async def main():
    store = PostgresStepStore(dsn=url, table_prefix=prefix)
    await store.list_runs()  # connect and set up the schema before the start signal
    Path(f'{go}.{run_id}.ready').write_text('')
    while not go.exists():
        await asyncio.sleep(0.005)
    await store.register_run(RunRecord(run_id=run_id, conversation_id='conv'))
    messages = [ModelRequest(parts=[UserPromptPart(f'start {run_id}')])]
    for i in range(steps):
        call = f'{run_id}-{i}'
        await store.append_event(StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_STARTED, step_index=i))
        await store.record_tool_effect(ToolEffectRecord(run_id=run_id, tool_call_id=call, tool_name='work'))
        messages.append(ModelResponse(parts=[ToolCallPart('work', {'i': i}, tool_call_id=call)]))
        messages.append(ModelRequest(parts=[ToolReturnPart('work', f'{run_id} result {i} ' * 40, tool_call_id=call)]))
        await store.record_tool_effect(
            ToolEffectRecord(run_id=run_id, tool_call_id=call, tool_name='work', status=ToolEffectStatus.COMPLETED)
        )
        await store.append_event(StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_COMPLETED, step_index=i))
        await store.save_snapshot(
            ContinuableSnapshot(run_id=run_id, step_index=i, messages=list(messages), idempotency_key=f's{i}')
        )
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
            events = await store.list_events(run_id)
            assert [e.seq for e in events] == list(range(1, 2 * STEPS + 1))
            assert [(e.kind, e.step_index) for e in events] == [
                (kind, i) for i in range(STEPS) for kind in (EventKind.TOOL_CALL_STARTED, EventKind.TOOL_CALL_COMPLETED)
            ]
            effects = await store.list_tool_effects(run_id)
            assert [e.tool_call_id for e in effects] == [f'{run_id}-{i}' for i in range(STEPS)]
            assert all(e.status is ToolEffectStatus.COMPLETED for e in effects)
            assert await store.list_unresolved_tool_effects(run_id) == []
            snapshots = await store.list_snapshots(run_id)
            assert [s.seq for s in snapshots] == list(range(1, STEPS + 1))
            latest = snapshots[-1]
            assert len(latest.messages) == 1 + 2 * STEPS
            assert all(f'{run_id} result' in str(m) for m in latest.messages[2::2])
    finally:
        await store.aclose()
