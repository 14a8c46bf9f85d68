"""How long `StepStore.prune` takes over many small runs.

Not a test: run `uv run python bench/bench_prune.py [--runs 10000] [--backends sqlite file]`.

Each backend gets a fresh store holding `--runs` small runs, every one started and last written
40 days ago: a run record, 3 events, 1 ledger entry and 1 snapshot of 2 messages. The filling is
not timed. Then `prune(timedelta(days=30), dry_run=True)` and `prune(timedelta(days=30))` are
timed, wall clock and this process's CPU (the store's threads included), and the table gives both
and the runs examined per second of wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    StepEvent,
    StepStore,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.store.lifecycle import PruneReport
from stepcore.store.models import utcnow

CHUNK = 50
"""Runs written concurrently while filling (SQLite groups their commits)."""


def _sqlite(directory: Path) -> StepStore:
    from step_sqlite import SqliteStepStore

    return SqliteStepStore(database=directory / 'runs.db')


def _file(directory: Path) -> StepStore:
    from step_file import FileStepStore

    return FileStepStore(directory=directory / 'runs')


BACKENDS: dict[str, Callable[[Path], StepStore]] = {'sqlite': _sqlite, 'file': _file}


async def _one_run(store: StepStore, n: int) -> None:
    then = utcnow() - timedelta(days=40)
    run_id = f'run-{n:06d}'
    await store.register_run(RunRecord(run_id=run_id, agent_name='bench', started_at=then))
    messages = [
        ModelRequest(parts=[UserPromptPart(f'question {n}')]),
        ModelResponse(parts=[TextPart(f'answer {n}')]),
    ]
    await store.write_batch(
        [
            StepEvent(run_id=run_id, kind=EventKind.RUN_STARTED, step_index=0, timestamp=then),
            ToolEffectRecord(
                run_id=run_id,
                tool_call_id='call-1',
                tool_name='lookup',
                status=ToolEffectStatus.COMPLETED,
                started_at=then,
                updated_at=then,
            ),
            StepEvent(run_id=run_id, kind=EventKind.MODEL_REQUEST_COMPLETED, step_index=1, timestamp=then),
            StepEvent(run_id=run_id, kind=EventKind.RUN_COMPLETED, step_index=1, timestamp=then),
        ],
        snapshot=ContinuableSnapshot(run_id=run_id, messages=messages, step_index=1, timestamp=then),
    )


async def _fill(store: StepStore, runs: int) -> None:
    for start in range(0, runs, CHUNK):
        await asyncio.gather(*(_one_run(store, n) for n in range(start, min(start + CHUNK, runs))))


async def _timed(work: Callable[[], Awaitable[PruneReport]]) -> tuple[PruneReport, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = await work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


async def bench(backend: str, runs: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix='bench-prune-') as tmp:
        store = BACKENDS[backend](Path(tmp))
        async with store:
            fill_start = time.perf_counter()
            await _fill(store, runs)
            fill = time.perf_counter() - fill_start
            dry, dry_wall, dry_cpu = await _timed(lambda: store.prune(timedelta(days=30), dry_run=True))
            real, wall, cpu = await _timed(lambda: store.prune(timedelta(days=30)))
            left = len(await store.list_runs())
    rows: list[str] = []
    for label, report, w, c in (('dry run', dry, dry_wall, dry_cpu), ('prune', real, wall, cpu)):
        pruned = len(report.runs)
        rows.append(
            f'| {backend} | {label} | {pruned:,} | {w:.2f} s | {c:.2f} s | {pruned / w:,.0f} |'
            f' {w / max(pruned, 1) * 1000:.2f} ms |'
        )
    print(f'{backend}: filled {runs:,} runs in {fill:.1f} s; {left} left after prune', flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--runs', type=int, default=10_000)
    parser.add_argument('--backends', nargs='+', choices=sorted(BACKENDS), default=['sqlite', 'file'])
    args = parser.parse_args()
    rows: list[str] = []
    for backend in args.backends:
        rows.extend(asyncio.run(bench(backend, args.runs)))
    print(f'\nprune over {args.runs:,} idle runs, Python {platform.python_version()} on {platform.machine()}\n')
    print('| store | call | runs removed | wall | CPU | runs/s | wall per run |')
    print('|---|---|---:|---:|---:|---:|---:|')
    for row in rows:
        print(row)


if __name__ == '__main__':
    main()
