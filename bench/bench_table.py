"""The cost of a step in one table: one run of N steps, a short run, and K runs of M steps at once.

Not a test: run `uv run python bench/bench_table.py [--steps 200] [--short 45] [--runs 50]
[--conc-steps 40] [--rounds 5] [--backends none memory sqlite file postgres redis]`.

Every cell is a fresh interpreter running the workload of `bench_steps.py` (a real `Agent` on a
`FunctionModel`, one tool call per step, 2 KB tool returns) or of `bench_concurrency.py` (K such
runs on one event loop, one store). Rounds are interleaved: each round runs every workload on
every backend, in an order that rotates from round to round, so a busy moment of a shared machine
falls on all of them alike. For each workload and backend the table gives medians over rounds of
the wall time and the process CPU time (all threads), the wall time over the unpersisted run of
the same round, the CPU that persistence adds per step (the backend's CPU minus the unpersisted
run's, over the steps), and for the single runs the bytes the store holds once closed. Every
cell attaches plain `StepPersistence` (the concurrent cells without `bench_concurrency.py`'s hook
timer).

`--tree NAME=PATH` (repeatable) runs the same cells on other checkouts of stepcore side by side
(their `packages/*/src` and `tests-shared/src` go first on `PYTHONPATH`), to compare two versions
in one measurement. Backends whose package or server is missing are left out with a note
(`STEP_POSTGRES_URL`, `STEP_REDIS_URL`, see `scripts/`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_steps import available, fresh_cell

HERE = Path(__file__).parent
STEPS_SCRIPT = HERE / 'bench_steps.py'
CONCURRENCY_SCRIPT = HERE / 'bench_concurrency.py'


@dataclass(frozen=True)
class Workload:
    label: str
    script: Path
    args: tuple[int, ...]
    steps: int
    """Steps of the whole workload (all runs), for the CPU added per step."""


@dataclass
class Cell:
    samples: list[dict[str, Any]] = field(default_factory=lambda: list[dict[str, Any]]())


def workloads(steps: int, short: int, runs: int, conc_steps: int) -> list[Workload]:
    return [
        Workload(f'one run, {steps} steps', STEPS_SCRIPT, (steps,), steps),
        Workload(f'one run, {short} steps', STEPS_SCRIPT, (short,), short),
        Workload(
            f'{runs} concurrent runs x {conc_steps} steps', CONCURRENCY_SCRIPT, (runs, conc_steps), runs * conc_steps
        ),
    ]


def tree_env(path: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if path is not None:
        sources = [*sorted(str(p) for p in path.glob('packages/*/src')), str(path / 'tests-shared' / 'src')]
        env['PYTHONPATH'] = os.pathsep.join([*sources, env.get('PYTHONPATH', '')]).rstrip(os.pathsep)
    return env


def measure(workload: Workload, backend: str, env: dict[str, str]) -> dict[str, Any]:
    # the concurrent cells attach plain StepPersistence: the hook timer of bench_concurrency.py
    # would add its own cost to the persisted cells only
    mode = ('untimed',) if workload.script == CONCURRENCY_SCRIPT else ()
    return fresh_cell(str(workload.script), f'{workload.label} on {backend}', backend, *workload.args, *mode, env=env)


def rotated(items: Sequence[str], by: int) -> list[str]:
    by %= len(items)
    return [*items[by:], *items[:by]]


def table(cells: dict[tuple[str, str, str], Cell], trees: list[str], loads: list[Workload], backends: list[str]) -> str:
    lines = [
        '| workload | tree | backend | wall (s) | CPU (s) | wall vs none | CPU added per step (ms) | bytes |',
        '|---|---|---|---:|---:|---:|---:|---:|',
    ]
    for load in loads:
        for tree in trees:
            base = cells[(tree, load.label, 'none')].samples if 'none' in backends else None
            for backend in backends:
                samples = cells[(tree, load.label, backend)].samples
                wall = statistics.median(s['seconds'] for s in samples)
                cpu = statistics.median(s['cpu'] for s in samples)
                ratio = added = '—'
                if base is not None and backend != 'none':
                    pairs = list(zip(samples, base, strict=True))
                    ratio = f'{statistics.median(s["seconds"] / b["seconds"] for s, b in pairs):.2f}x'
                    per_step = statistics.median((s['cpu'] - b['cpu']) / load.steps for s, b in pairs)
                    added = f'{per_step * 1000:+.2f}'
                size = samples[0].get('closed_size')
                lines.append(
                    f'| {load.label} | {tree} | {backend} | {wall:.3f} | {cpu:.3f} | {ratio} | {added} | '
                    f'{size if size is not None else "—"} |'
                )
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--steps', type=int, default=200)
    parser.add_argument('--short', type=int, default=45)
    parser.add_argument('--runs', type=int, default=50)
    parser.add_argument('--conc-steps', type=int, default=40)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--backends', nargs='+', default=['none', 'memory', 'sqlite', 'file', 'postgres', 'redis'])
    parser.add_argument(
        '--tree', action='append', default=[], metavar='NAME=PATH', help='another checkout to measure beside this one'
    )
    args = parser.parse_args()

    backends = available(args.backends)
    trees: dict[str, Path | None] = {'this': None}
    for spec in args.tree:
        name, _, path = spec.partition('=')
        if not name or not path or not Path(path, 'packages').is_dir():
            parser.error(f'--tree {spec!r}: give NAME=PATH, PATH a stepcore checkout (it has packages/)')
        trees[name] = Path(path).resolve()
    loads = workloads(args.steps, args.short, args.runs, args.conc_steps)
    cells = {(tree, load.label, backend): Cell() for tree in trees for load in loads for backend in backends}
    for round_number in range(args.rounds):
        for tree in rotated(list(trees), round_number):
            env = tree_env(trees[tree])
            for load in loads:
                for backend in rotated(backends, round_number):
                    cells[(tree, load.label, backend)].samples.append(measure(load, backend, env))
        print(f'round {round_number + 1} of {args.rounds} done', file=sys.stderr, flush=True)
    print(f'medians of {args.rounds} interleaved rounds, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}')
    print()
    print(table(cells, list(trees), loads, backends))


if __name__ == '__main__':
    main()
