"""Several processes writing one SQLite database at the same time lose nothing."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from step_sqlite import SqliteStepStore
from stepcore import EventKind, SnapshotState, ToolEffectStatus

STEPS = 30

WRITER = """
import asyncio, sys, time
from pathlib import Path
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart
from step_sqlite import SqliteStepStore
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus

database, go, run_id, conversation, steps = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])

async def main():
    store = SqliteStepStore(database=database)
    await store.list_runs()  # open and set up the schema before the start signal
    print('ready', flush=True)
    while not go.exists():
        time.sleep(0.005)
    await store.register_run(RunRecord(run_id=run_id, conversation_id=conversation or None))
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
        await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=i, messages=list(messages)))
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
            events = await store.list_events(run_id)
            assert [e.seq for e in events] == list(range(1, 2 * STEPS + 1))
            assert [e.kind for e in events[:2]] == [EventKind.TOOL_CALL_STARTED, EventKind.TOOL_CALL_COMPLETED]
            effects = await store.list_tool_effects(run_id)
            assert len(effects) == STEPS
            assert all(e.status is ToolEffectStatus.COMPLETED for e in effects)
            assert await store.list_unresolved_tool_effects(run_id) == []
            snapshots = await store.list_snapshots(run_id)
            assert [s.step_index for s in snapshots] == list(range(STEPS))
            assert all(s.state is SnapshotState.COMPLETE for s in snapshots)
            latest = await store.latest_snapshot(run_id)
            assert latest is not None
            assert len(latest.messages) == 1 + 2 * STEPS
            assert f'{run_id} result {STEPS - 1}' in str(latest.messages[-1])
    finally:
        await store.aclose()
