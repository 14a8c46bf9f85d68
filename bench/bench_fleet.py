"""How long an orphan waits for a worker in a fleet under fire: pickup latency per backend.

Not a test: run `uv run python bench/bench_fleet.py [--rounds 3] [--backends sqlite postgres redis mongo]
[--resumers 2]` with the test servers' variables set (STEP_POSTGRES_URL, STEP_REDIS_URL, STEP_MONGO_URL:
`scripts/test.sh` shows how to start them).

Each measurement is one run of the fleet chaos test (`tests/test_fleet_chaos.py`: 4 worker processes
on one store, a 1 s lease, a 0.5 s loop interval, SIGKILLs every few tenths of a second, SIGSTOPs past
the lease, on PostgreSQL workers frozen inside a transaction) in a fresh pytest process, alone on the
machine. Backends are interleaved round by round; the table gives, per backend, the medians over
rounds of the pickup latency's p50 and p99 (from the moment a run became an orphan to a worker's
claim), beside their targets (p50 <= lease + 1 s, p99 <= 2 x lease + interval), of the same from the
claiming worker's first listing of the orphan (the loop's own part of the wait), and of the jobs the
fleet completed, the wall time and the CPU time of the test and its workers (the database server's
own aside). `--resumers` sets each worker's recovery `concurrency` on the fast stores (MongoDB's
scale keeps one).
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name('results-fleet.md')
TEST = ROOT / 'tests' / 'test_fleet_chaos.py'
LEASE = 1.0
INTERVAL = LEASE / 2
SERVERS = {'postgres': 'STEP_POSTGRES_URL', 'redis': 'STEP_REDIS_URL', 'mongo': 'STEP_MONGO_URL'}


@dataclass
class Sample:
    p50: float
    p99: float
    listed_p50: float
    """From the claiming worker's first listing of the orphan to its claim: the loop's own part."""
    listed_p99: float
    pickups: int
    jobs_completed: int
    wall: float
    cpu: float


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(backend: str, resumers: int) -> Sample:
    """One run of the chaos test on `backend`: its printed summary, timed."""
    env = {**os.environ, 'CHAOS_RESUMERS': str(resumers)}
    cpu_before = _children_cpu()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-s', '-p', 'no:cacheprovider', str(TEST), '-k', backend],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    cpu = _children_cpu() - cpu_before
    line = next((row for row in done.stdout.splitlines() if row.startswith(f'fleet under fire ({backend},')), None)
    if done.returncode != 0 or line is None:
        tail = '\n'.join((done.stdout + done.stderr).splitlines()[-30:])
        raise SystemExit(f'the chaos test failed on {backend} (exit {done.returncode}):\n{tail}')
    summary: dict[str, Any] = ast.literal_eval(line.split(': ', 1)[1])
    return Sample(
        p50=float(summary['pickup p50 (s)']),
        p99=float(summary['pickup p99 (s)']),
        listed_p50=float(summary['listed to claimed p50 (s)']),
        listed_p99=float(summary['listed to claimed p99 (s)']),
        pickups=int(summary['pickups']),
        jobs_completed=int(summary['jobs completed']),
        wall=wall,
        cpu=cpu,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--backends', nargs='+', default=['sqlite', 'postgres', 'redis', 'mongo'])
    parser.add_argument('--resumers', type=int, default=2)
    parser.add_argument('--no-write', action='store_true', help='print the table only')
    args = parser.parse_args()
    unknown = [b for b in args.backends if b != 'sqlite' and b not in SERVERS]
    if unknown:
        parser.error(f'unknown backend {unknown[0]!r}: choose from sqlite, {", ".join(SERVERS)}')
    missing = [SERVERS[b] for b in args.backends if b in SERVERS and not os.environ.get(SERVERS[b])]
    if missing:
        parser.error(f'{", ".join(missing)} not set: start the test servers first (see scripts/test.sh)')
    if args.rounds < 1:
        parser.error(f'--rounds {args.rounds} measures nothing: pass 1 or more')

    samples: dict[str, list[Sample]] = {b: [] for b in args.backends}
    for round_no in range(args.rounds):
        for backend in args.backends:
            sample = run_once(backend, args.resumers)
            samples[backend].append(sample)
            print(
                f'round {round_no + 1} {backend}: p50 {sample.p50:.2f} s, p99 {sample.p99:.2f} s '
                f'(listed to claimed {sample.listed_p50:.2f} / {sample.listed_p99:.2f} s), '
                f'{sample.pickups} pickups, {sample.jobs_completed} jobs, {sample.wall:.0f} s wall, '
                f'{sample.cpu:.0f} s CPU',
                flush=True,
            )

    target50, target99 = LEASE + 1.0, 2 * LEASE + INTERVAL
    rows = [
        f'| backend | pickup p50 (target {target50:.1f} s) | pickup p99 (target {target99:.1f} s) '
        '| p99 of each round | listed to claimed p50 / p99 | jobs completed | wall | CPU (test and workers) |',
        '|---|---:|---:|---|---:|---:|---:|---:|',
    ]
    med = statistics.median
    for backend, found in samples.items():
        rows.append(
            f'| {backend} | {med(s.p50 for s in found):.2f} s | {med(s.p99 for s in found):.2f} s '
            f'| {", ".join(f"{s.p99:.2f}" for s in found)} '
            f'| {med(s.listed_p50 for s in found):.2f} / {med(s.listed_p99 for s in found):.2f} s '
            f'| {med(s.jobs_completed for s in found):.0f} '
            f'| {med(s.wall for s in found):.0f} s | {med(s.cpu for s in found):.0f} s |'
        )
    table = '\n'.join(rows)
    print(table)
    if not args.no_write:
        load = os.getloadavg()[0]
        RESULTS.write_text(
            '# Fleet pickup latency\n\n'
            f'`bench/bench_fleet.py --rounds {args.rounds} --resumers {args.resumers}` on {platform.platform()}, '
            f'{os.cpu_count()} CPUs, Python {platform.python_version()}, load average {load:.1f} at the end. '
            f'Medians of {args.rounds} interleaved rounds.\n\n{table}\n',
            encoding='utf-8',
        )


if __name__ == '__main__':
    main()
