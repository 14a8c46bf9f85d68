"""What step persistence costs when many runs share one store.

Not a test: run `uv run python bench/bench_concurrency.py [--runs 50] [--steps 40] [--backends none sqlite file]`.

K agent runs of N tool steps each run concurrently on one event loop, all persisted to one store
(the workload of `bench_steps.py`: a real `Agent` on a `FunctionModel`, one tool call per step,
2 KB tool returns). Each measurement is a fresh interpreter; backends are interleaved round by
round, and the table gives medians over rounds: wall time, process CPU time (all threads), steps
per second, and the ratio of each round's wall time to the unpersisted run of the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic_ai.usage import UsageLimits

sys.path.insert(0, str(Path(__file__).parent))

from bench_steps import BACKENDS, available, build_agent

from stepcore.capability import StepPersistence

RESULTS = Path(__file__).with_name('results-concurrency.md')


@dataclass
class Sample:
    seconds: float
    cpu: float


async def run_once(backend_name: str, runs: int, steps: int) -> Sample:
    tmp = Path(tempfile.mkdtemp(prefix=f'bench-conc-{backend_name}-'))
    try:
        backend = BACKENDS[backend_name](tmp)
        capabilities: list[Any] = [StepPersistence(store=backend.store)] if backend.store is not None else []
        agents = [build_agent(steps, capabilities) for _ in range(runs)]
        if backend.store is not None:
            await backend.store.list_runs()  # open the connection and create the schema before timing
        gc.collect()
        start = time.perf_counter()
        cpu_start = time.process_time()
        results = await asyncio.gather(
            *(agent.run('go', usage_limits=UsageLimits(request_limit=None)) for agent in agents)
        )
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        if any(r.output != 'done' for r in results):
            raise RuntimeError('unexpected output')
        if backend.store is not None:
            stored = await backend.store.list_runs()
            if len(stored) != runs:
                raise RuntimeError(f'{backend_name}: {len(stored)} runs stored, expected {runs}')
            latest = await backend.store.latest_snapshot(stored[0].run_id)
            if latest is None or len(latest.messages) < 2 * steps:
                raise RuntimeError(f'{backend_name}: the store lost the history')
        await backend.close()
        return Sample(seconds, cpu)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_cell(backend_name: str, runs: int, steps: int) -> Sample:
    out = subprocess.run(
        [sys.executable, __file__, '--cell', backend_name, str(runs), str(steps)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f'{backend_name} failed:\n{out.stderr}')
    return Sample(**json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--runs', type=int, default=50)
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--backends', nargs='+', default=['none', 'memory', 'sqlite', 'file', 'postgres', 'mongo'])
    parser.add_argument('--no-write', action='store_true')
    parser.add_argument('--cell', nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        name, runs, steps = args.cell
        print(json.dumps(asdict(asyncio.run(run_once(name, int(runs), int(steps))))))
        return
    backends = available(args.backends)
    samples: dict[str, list[Sample]] = {b: [] for b in backends}
    for _ in range(args.rounds):
        for name in backends:
            samples[name].append(run_cell(name, args.runs, args.steps))
            print(f'{name}: {samples[name][-1]}', flush=True)
    total = args.runs * args.steps
    rows = []
    for name in backends:
        wall = statistics.median(s.seconds for s in samples[name])
        cpu = statistics.median(s.cpu for s in samples[name])
        ratio = '-'
        if 'none' in samples:
            pairs = zip(samples[name], samples['none'], strict=True)
            ratio = f'{statistics.median(s.seconds / b.seconds for s, b in pairs):.2f}x'
        rows.append(
            f'| {name} | {args.runs} x {args.steps} | {wall:.2f} s | {cpu:.2f} s | {total / wall:.0f} | {ratio} |'
        )
    table = '\n'.join(
        [
            '| backend | runs x steps | wall (median) | CPU (median) | steps/s | vs none (median of rounds) |',
            '|---|---|---|---|---|---|',
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


if __name__ == '__main__':
    main()
