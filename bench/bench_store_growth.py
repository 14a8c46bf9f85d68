"""What one run's writes cost a store as the run grows to 10,000 steps, without an agent.

Not a test: run `uv run python bench/bench_store_growth.py [--steps 10000] [--backends sqlite file]`.

`bench_long_run.py` times persistence inside a real agent run, but pydantic-ai's own work per
step grows with the history, so a real run of 10,000 steps takes hours on a small machine. This
benchmark replays, straight to a store, what `StepPersistence` writes per tool step of that
workload: one `write_batch` with the call's `started` ledger entry and its event, then one with
the snapshot holding the tool's 2 KB return, the `completed` entry and the next request's event.
The history is one list of message objects that grows by two per step, and each save gets a copy
of it (as the capability hands a store a new list of the live history's objects). At each mark
the table gives the median wall and process CPU time (all threads) of the two calls of a step
over the `--window` steps up to the mark, its ratio to the first mark, and the bytes on disk per
step. Each backend runs in a fresh interpreter; with `--rounds` above 1 backends are
interleaved and medians over rounds are given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

sys.path.insert(0, str(Path(__file__).parent))

from bench_steps import BACKENDS, available, dir_size, fresh_cell, tool_text

from stepcore import ContinuableSnapshot, EventKind, RunRecord, SnapshotState, StepEvent, ToolEffectRecord
from stepcore import ToolEffectStatus as Status

RESULTS = Path(__file__).with_name('results-store-growth.md')


async def run_once(backend_name: str, steps: int, marks: list[int], window: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f'bench-growth-{backend_name}-'))
    try:
        backend = BACKENDS[backend_name](tmp)
        store = backend.store
        assert store is not None
        run_id = 'growth'
        await store.register_run(RunRecord(run_id=run_id, agent_name='bench'))
        history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
        walls: list[float] = []
        cpus: list[float] = []
        sizes: dict[int, int] = {}
        for step in range(1, steps + 1):
            call_id = f'c{step}'
            history.append(ModelResponse(parts=[ToolCallPart('fetch', {'i': step}, tool_call_id=call_id)]))
            started = ToolEffectRecord(
                run_id=run_id, tool_call_id=call_id, tool_name='fetch', status=Status.STARTED, step_index=step
            )
            history.append(ModelRequest(parts=[ToolReturnPart('fetch', tool_text(step), tool_call_id=call_id)]))
            snapshot = ContinuableSnapshot.model_construct(
                run_id=run_id,
                step_index=step,
                messages=list(history),
                state=SnapshotState.COMPLETE,
                timestamp=datetime.now(UTC),
                agent_name='bench',
                conversation_id=None,
                parent_run_id=None,
                metadata={},
                idempotency_key=f'snapshot:{step}:{step}:complete',
                seq=None,
            )
            wall, cpu = time.perf_counter(), time.process_time()
            await store.write_batch(
                [
                    started,
                    StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_STARTED, step_index=step, tool_call_id=call_id),
                ]
            )
            await store.write_batch(
                [
                    started.model_copy(update={'status': Status.COMPLETED}),
                    StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_COMPLETED, step_index=step, tool_call_id=call_id),
                    StepEvent(run_id=run_id, kind=EventKind.MODEL_REQUEST_STARTED, step_index=step + 1),
                ],
                snapshot=snapshot,
            )
            cpus.append(time.process_time() - cpu)
            walls.append(time.perf_counter() - wall)
            if step in marks and backend_name in ('sqlite', 'file'):
                sizes[step] = dir_size(tmp)
        latest = await store.latest_snapshot(run_id)
        if latest is None or len(latest.messages) != len(history):
            raise RuntimeError(f'{backend_name}: the store lost the history')
        await backend.close()
        out: dict[str, Any] = {}
        for mark in marks:
            out[str(mark)] = {
                'wall': statistics.median(walls[max(0, mark - window) : mark]),
                'cpu': statistics.median(cpus[max(0, mark - window) : mark]),
                'bytes': sizes.get(mark),
            }
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_cell(backend_name: str, steps: int, marks: list[int], window: int) -> dict[str, Any]:
    return fresh_cell(__file__, backend_name, backend_name, steps, ','.join(map(str, marks)), window)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--steps', type=int, default=10_000)
    parser.add_argument('--marks', type=int, nargs='+', default=[100, 1_000, 10_000])
    parser.add_argument('--window', type=int, default=100)
    parser.add_argument('--rounds', type=int, default=1)
    parser.add_argument('--backends', nargs='+', default=['memory', 'sqlite', 'file'])
    parser.add_argument('--no-write', action='store_true')
    parser.add_argument('--cell', nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        name, steps, marks, window = args.cell
        print(json.dumps(asyncio.run(run_once(name, int(steps), [int(m) for m in marks.split(',')], int(window)))))
        return
    marks = [m for m in args.marks if m <= args.steps]
    backends = [b for b in available(args.backends) if b != 'none']
    cells: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    for _ in range(args.rounds):
        for name in backends:
            cells[name].append(run_cell(name, args.steps, marks, args.window))
            print(f'{name}: {cells[name][-1]}', flush=True)
    rows: list[str] = []
    for name in backends:
        first = statistics.median(c[str(marks[0])]['wall'] for c in cells[name])
        for mark in marks:
            wall = statistics.median(c[str(mark)]['wall'] for c in cells[name])
            cpu = statistics.median(c[str(mark)]['cpu'] for c in cells[name])
            sizes = [c[str(mark)]['bytes'] for c in cells[name] if c[str(mark)]['bytes'] is not None]
            per_step = f'{statistics.median(sizes) / mark:,.0f} B' if sizes else '-'
            rows.append(
                f'| {name} | {mark:,} | {wall * 1000:.3f} ms | {cpu * 1000:.3f} ms | {wall / first:.2f}x | {per_step} |'
            )
    table = '\n'.join(
        [
            '| backend | step | store time per step (median) | CPU per step (median) | vs first mark '
            '| bytes on disk per step |',
            '|---|---|---|---|---|---|',
            *rows,
        ]
    )
    print(table)
    if not args.no_write:
        RESULTS.write_text(
            f'# bench_store_growth results\n\n`uv run python bench/bench_store_growth.py {" ".join(sys.argv[1:])}`\n\n'
            f'Python {platform.python_version()}, {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs. '
            f'{args.rounds} round(s), window of {args.window} steps.\n\n{table}\n'
        )


if __name__ == '__main__':
    main()
