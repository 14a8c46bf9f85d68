"""What step persistence costs when many runs share one store.

Not a test: run `uv run python bench/bench_concurrency.py [--runs 1 10 50 200] [--steps 40]
[--backends none sqlite file]`.

K agent runs of N tool steps each run concurrently on one event loop, all persisted to one store
(the workload of `bench_steps.py`: a real `Agent` on a `FunctionModel`, one tool call per step,
2 KB tool returns). Each measurement is a fresh interpreter; backends are interleaved round by
round, and the table gives medians over rounds of: wall time, process CPU time (all threads),
steps per second, the ratio of each round's wall time to the unpersisted run of the same round,
the CPU time persistence adds per step (the backend's CPU minus the unpersisted run's, over the
steps), and the 50th and 99th percentiles of the time a step spends inside the persistence hooks
(store writes awaited there included; see `hook_timer.py`).
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stepcore import StepPersistence

sys.path.insert(0, str(Path(__file__).parent))

from bench_steps import BACKENDS, available, build_agent, fresh_cell, run_all
from hook_timer import TimedPersistence, percentile

RESULTS = Path(__file__).with_name('results-concurrency.md')


@dataclass
class Sample:
    seconds: float
    cpu: float
    p50: float = 0.0
    """Seconds a step spends in the persistence hooks: median over steps."""
    p99: float = 0.0


async def run_once(backend_name: str, runs: int, steps: int, *, timed: bool = True) -> Sample:
    """One cell; `timed=False` attaches plain `StepPersistence` (no hook timer, no percentiles), so
    the wall and CPU time are those of persistence as users attach it."""
    tmp = Path(tempfile.mkdtemp(prefix=f'bench-conc-{backend_name}-'))
    try:
        backend = BACKENDS[backend_name](tmp)
        capabilities: list[Any] = []
        steps_seen: list[list[float]] = []
        if backend.store is not None and timed:
            timer = TimedPersistence(store=backend.store)
            timer.sink = steps_seen
            capabilities.append(timer)
        elif backend.store is not None:
            capabilities.append(StepPersistence(store=backend.store))
        agents = [build_agent(steps, capabilities) for _ in range(runs)]
        if backend.store is not None:
            await backend.store.list_runs()  # open the connection and create the schema before timing
        seconds, cpu = await run_all(agents)
        if backend.store is not None:
            stored = await backend.store.list_runs()
            if len(stored) != runs:
                raise RuntimeError(f'{backend_name}: {len(stored)} runs stored, expected {runs}')
            latest = await backend.store.latest_snapshot(stored[0].run_id)
            if latest is None or len(latest.messages) < 2 * steps:
                raise RuntimeError(f'{backend_name}: the store lost the history')
        await backend.close()
        per_step = [seconds for run in steps_seen for seconds in run]
        if not per_step:
            return Sample(seconds, cpu)
        return Sample(seconds, cpu, percentile(per_step, 0.5), percentile(per_step, 0.99))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_cell(backend_name: str, runs: int, steps: int) -> Sample:
    return Sample(**fresh_cell(__file__, backend_name, backend_name, runs, steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--runs', type=int, nargs='+', default=[1, 10, 50, 200])
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--backends', nargs='+', default=['none', 'memory', 'sqlite', 'file', 'postgres', 'mongo'])
    parser.add_argument('--no-write', action='store_true')
    parser.add_argument('--cell', nargs='+', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        name, runs, steps, *mode = args.cell
        timed = mode != ['untimed']
        print(json.dumps(asdict(asyncio.run(run_once(name, int(runs), int(steps), timed=timed)))))
        return
    backends = available(args.backends)
    if 'none' not in backends:
        backends.insert(0, 'none')
    rows: list[str] = []
    for runs in args.runs:
        samples: dict[str, list[Sample]] = {b: [] for b in backends}
        for _ in range(args.rounds):
            for name in backends:
                samples[name].append(run_cell(name, runs, args.steps))
                print(f'K={runs} {name}: {samples[name][-1]}', flush=True)
        rows.extend(_rows(samples, runs, args.steps))
    table = '\n'.join(
        [
            '| backend | runs x steps | wall | CPU | steps/s | wall vs none | added CPU/step '
            '| hooks p50/step | hooks p99/step |',
            '|---|---|---|---|---|---|---|---|---|',
            *rows,
        ]
    )
    print(table)
    if not args.no_write:
        RESULTS.write_text(
            f'# bench_concurrency results\n\n`uv run python bench/bench_concurrency.py {" ".join(sys.argv[1:])}`\n\n'
            f'Python {platform.python_version()}, {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs. '
            f'Medians of {args.rounds} interleaved rounds.\n\n{table}\n'
        )


def _rows(samples: dict[str, list[Sample]], runs: int, steps: int) -> list[str]:
    total = runs * steps
    base = samples['none']
    rows: list[str] = []
    for name, cells in samples.items():
        wall = statistics.median(s.seconds for s in cells)
        cpu = statistics.median(s.cpu for s in cells)
        ratio = statistics.median(s.seconds / b.seconds for s, b in zip(cells, base, strict=True))
        added = statistics.median((s.cpu - b.cpu) / total for s, b in zip(cells, base, strict=True))
        if name == 'none':
            extra = '| - | - | - |'
        else:
            p50 = statistics.median(s.p50 for s in cells)
            p99 = statistics.median(s.p99 for s in cells)
            extra = f'| {added * 1000:.2f} ms | {p50 * 1000:.2f} ms | {p99 * 1000:.2f} ms |'
        head = f'| {name} | {runs} x {steps} | {wall:.2f} s | {cpu:.2f} s | {total / wall:.0f} | {ratio:.2f}x '
        rows.append(head + extra)
    return rows


if __name__ == '__main__':
    main()
