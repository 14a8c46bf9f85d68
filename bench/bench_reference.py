"""The reference library's figures on the workloads of `bench_concurrency.py` and `bench_long_run.py`.

Not a test: run `uv run python bench/bench_reference.py [--python PATH] [--runs 1 10 50] [--steps 40]
[--rounds 5] [--long-steps 1000]`.

The reference is pydantic-ai-harness (0.62.0, on pydantic-ai 2.62) in a venv of its own: every
measurement is a fresh interpreter of that venv running `reference_worker.py`, which imports
pydantic-ai and pydantic_ai_harness only. Its interpreter is `--python`, by default the environment
variable `STEPCORE_REFERENCE_PYTHON`. Backends: `none` (no persistence), and the reference's
`StepPersistence` on its `sqlite` and `file` stores (`memory` on request), with their defaults.

1. Concurrency, as `bench_concurrency.py`: K runs of N tool steps at once on one store (a real
   `Agent` on a `FunctionModel`, one tool call per step, 2 KB tool returns: the worker carries a
   copy of `bench_steps.build_agent`, and the driver stops when the copy no longer matches).
   Backends are interleaved round by round; the table gives medians over rounds of wall time,
   process CPU, steps per second, the ratio of each round's wall time to the unpersisted run of
   the same round, the CPU persistence adds per step, and the p50 and p99 of the time a step
   spends in the persistence hooks.
2. Long run, as `bench_long_run.py`: one run of `--long-steps` steps (the model reports its usage);
   at steps 100, 1,000 and 10,000 (those within the run) the median hook time of the `--window`
   steps up to the mark, its ratio to the first mark, and the bytes on disk per step.

What differs from our benchmarks: the unpersisted baseline is the reference venv's pydantic-ai
(2.62, ours runs on 2.68), so ratios are to the reference's own `none` run; the hooks timed are
the ones the reference implements (it records tool calls in `before_tool_execute` /
`after_tool_execute` rather than `wrap_tool_execute`), timed as `hook_timer.py` times ours; its
stores have no close, so nothing is closed after a run.

The reference keeps every step's snapshot with the whole history (the file store rewrites it all at
every step), so its cost grows with the run: each measurement has a timeout (`--timeout`, 600 s by
default), reported as `> 600 s` instead of failing; a backend that times out at K runs is not run at
larger K. A long run also reports the marks it reached before its timeout, and stops early when
the disk runs low (see `reference_worker.MIN_FREE_BYTES`). Results are printed as Markdown tables
and written to `bench/results-reference.md` unless `--no-write`.
"""

from __future__ import annotations

import argparse
import ast
import copy
import inspect
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import bench_steps

WORKER = Path(__file__).with_name('reference_worker.py')
RESULTS = Path(__file__).with_name('results-reference.md')
BACKENDS = ('none', 'memory', 'sqlite', 'file')
HOW_TO_MAKE = (
    'make one with:\n'
    '    uv venv /path/to/ref-venv\n'
    '    uv pip install --python /path/to/ref-venv/bin/python pydantic-ai-harness==0.62.0\n'
    'then pass --python /path/to/ref-venv/bin/python or set STEPCORE_REFERENCE_PYTHON to that path.'
)


class Stopped(Exception):
    """A measurement that did not finish: timed out, or stopped by the worker."""

    def __init__(self, reason: str, output: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.output = output


def reference_python(path: str | None) -> tuple[str, str]:
    """The reference interpreter and a line naming its versions; exits with how to make one when unusable."""
    if not path:
        sys.exit(
            f'No reference interpreter: STEPCORE_REFERENCE_PYTHON is not set and --python was not given; {HOW_TO_MAKE}'
        )
    if not Path(path).is_file():
        sys.exit(f'The reference interpreter {path!r} does not exist; {HOW_TO_MAKE}')
    probe = (
        'import platform, importlib.metadata as m, pydantic_ai_harness.step_persistence; '
        'print(f\'pydantic-ai-harness {m.version("pydantic-ai-harness")}, \''
        'f\'pydantic-ai {m.version("pydantic-ai-slim")}, Python {platform.python_version()}\')'
    )
    try:
        out = subprocess.run([path, '-c', probe], capture_output=True, text=True, check=False, timeout=120)
    except OSError as exc:
        sys.exit(f'The reference interpreter {path!r} cannot be started ({exc}); {HOW_TO_MAKE}')
    if out.returncode != 0:
        last = out.stderr.strip().splitlines()[-1:] or ['no output']
        sys.exit(f'The reference interpreter {path!r} cannot import pydantic_ai_harness ({last[0]}); {HOW_TO_MAKE}')
    return path, out.stdout.strip()


def check_workload() -> None:
    """Exit when the worker's copy of the workload differs from `bench_steps` (docstrings aside)."""
    worker = ast.parse(WORKER.read_text(encoding='utf-8'))
    copies: dict[str, ast.AST] = {}
    for node in worker.body:
        if isinstance(node, ast.FunctionDef):
            copies[node.name] = node
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            copies[node.targets[0].id] = node.value
    ours: dict[str, ast.AST] = {
        name: ast.parse(inspect.getsource(getattr(bench_steps, name))).body[0] for name in ('tool_text', 'build_agent')
    }
    ours['TOOL_RETURN_BYTES'] = ast.Constant(bench_steps.TOOL_RETURN_BYTES)
    for name, node in ours.items():
        if name not in copies or _shape(copies[name]) != _shape(node):
            sys.exit(f'{WORKER.name}: {name} no longer matches bench_steps.{name}; copy it again from bench_steps.py')


def _shape(node: ast.AST) -> str:
    """The code of a definition without its docstring, positions and formatting."""
    if isinstance(node, ast.FunctionDef):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            node = copy.copy(node)
            node.body = body[1:]
    return ast.dump(node, include_attributes=False)


def run_worker(python: str, args: list[str], timeout: float) -> list[dict[str, Any]]:
    """The JSON lines a worker printed; `Stopped` (with what it printed) when it timed out or stopped early."""
    # The worker's store goes under a directory of ours, removed even when the worker is killed.
    scratch = tempfile.mkdtemp(prefix='bench-reference-')
    try:
        out = subprocess.run(
            [python, str(WORKER), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env={**os.environ, 'TMPDIR': scratch},
        )
    except subprocess.TimeoutExpired as exc:
        printed = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or '')
        raise Stopped(f'> {timeout:.0f} s', printed) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if out.returncode == 3:
        lines = _json_lines(out.stdout)
        stop = next((line for line in lines if 'stopped' in line), {'stopped': 'stopped', 'step': '?'})
        raise Stopped(f'{stop["stopped"]} at step {stop["step"]}', out.stdout)
    if out.returncode != 0:
        raise RuntimeError(f'reference worker {" ".join(args)} failed:\n{out.stderr}')
    return _json_lines(out.stdout)


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{')]


# -- concurrency ------------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    cpu: float
    p50: float
    p99: float


@dataclass
class Cell:
    samples: list[Sample] = field(default_factory=list[Sample])
    stopped: str | None = None


def concurrency(python: str, args: argparse.Namespace) -> list[str]:
    backends: list[str] = ['none', *(b for b in args.backends if b != 'none')]
    slow: dict[str, str] = {}  # backend -> why it stopped; not run at larger K
    rows: list[str] = []
    for runs in args.runs:
        cells = {name: Cell() for name in backends}
        for _ in range(args.rounds):
            for name in backends:
                cell = cells[name]
                if name in slow:
                    cell.stopped = cell.stopped or slow[name]
                    continue
                try:
                    (line,) = run_worker(python, ['concurrency', name, str(runs), str(args.steps)], args.timeout)
                except Stopped as stop:
                    slow[name] = cell.stopped = stop.reason
                    print(f'K={runs} {name}: {stop.reason}', flush=True)
                    continue
                cell.samples.append(Sample(**line))
                print(f'K={runs} {name}: {cell.samples[-1]}', flush=True)
        rows.extend(_concurrency_rows(cells, runs, args.steps))
    return [
        '| backend | runs x steps | wall | CPU | steps/s | wall vs none | added CPU/step '
        '| hooks p50/step | hooks p99/step |',
        '|---|---|---|---|---|---|---|---|---|',
        *rows,
    ]


def _concurrency_rows(cells: dict[str, Cell], runs: int, steps: int) -> list[str]:
    total = runs * steps
    base = cells['none']
    rows: list[str] = []
    for name, cell in cells.items():
        label = f'| reference {name} | {runs} x {steps} '
        if cell.stopped is not None or not cell.samples:
            rows.append(label + f'| {cell.stopped or "-"} | - | - | - | - | - | - |')
            continue
        wall = statistics.median(s.seconds for s in cell.samples)
        cpu = statistics.median(s.cpu for s in cell.samples)
        paired = base.stopped is None and len(base.samples) == len(cell.samples)
        ratio = added = '-'
        if paired:
            pairs = list(zip(cell.samples, base.samples, strict=True))
            ratio = f'{statistics.median(s.seconds / b.seconds for s, b in pairs):.2f}x'
            added = f'{statistics.median((s.cpu - b.cpu) / total for s, b in pairs) * 1000:.2f} ms'
        if name == 'none':
            extra = '| - | - | - |'
        else:
            p50 = statistics.median(s.p50 for s in cell.samples)
            p99 = statistics.median(s.p99 for s in cell.samples)
            extra = f'| {added} | {p50 * 1000:.2f} ms | {p99 * 1000:.2f} ms |'
        rows.append(label + f'| {wall:.2f} s | {cpu:.2f} s | {total / wall:.0f} | {ratio} ' + extra)
    return rows


# -- long run ---------------------------------------------------------------------------------


def long_run(python: str, args: argparse.Namespace) -> list[str]:
    marks = [m for m in args.marks if m <= args.long_steps]
    backends = [b for b in args.backends if b != 'none']
    found: dict[str, list[dict[int, dict[str, Any]]]] = {b: [] for b in backends}
    stopped: dict[str, str] = {}
    for _ in range(args.long_rounds):
        for name in backends:
            cell = ['long', name, str(args.long_steps), ','.join(map(str, marks)), str(args.window)]
            try:
                lines = run_worker(python, cell, args.timeout)
            except Stopped as stop:
                stopped[name] = stop.reason
                lines = _json_lines(stop.output)
            reached = {int(line['mark']): line for line in lines if 'mark' in line}
            found[name].append(reached)
            print(f'long {name}: {reached}{" (" + stopped[name] + ")" if name in stopped else ""}', flush=True)
    rows: list[str] = []
    for name in backends:
        first: float | None = None
        for mark in marks:
            label = f'| reference {name} | {mark:,} '
            rounds = found[name]
            if not rounds or any(mark not in r for r in rounds):
                rows.append(label + f'| not reached ({stopped.get(name, "-")}) | - | - |')
                continue
            median = statistics.median(r[mark]['median'] for r in rounds)
            first = median if first is None else first
            sizes = [r[mark]['bytes'] for r in rounds if r[mark]['bytes'] is not None]
            per_step = f'{statistics.median(sizes) / mark:,.0f} B' if sizes else '-'
            rows.append(label + f'| {median * 1000:.3f} ms | {median / first:.2f}x | {per_step} |')
    return [
        '| backend | step | persistence time per step (median) | vs first mark | bytes on disk per step |',
        '|---|---|---|---|---|',
        *rows,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        '--python',
        default=os.environ.get('STEPCORE_REFERENCE_PYTHON'),
        help='interpreter of the reference venv (default: $STEPCORE_REFERENCE_PYTHON)',
    )
    parser.add_argument('--backends', nargs='+', choices=BACKENDS, default=['none', 'sqlite', 'file'])
    parser.add_argument('--runs', type=int, nargs='+', default=[1, 10, 50], help='K, concurrent runs')
    parser.add_argument('--steps', type=int, default=40, help='N, steps per run (concurrency)')
    parser.add_argument('--rounds', type=int, default=5, help='interleaved rounds (concurrency)')
    parser.add_argument('--long-steps', type=int, default=1_000, help='steps of the long run; 0 skips it')
    parser.add_argument('--marks', type=int, nargs='+', default=[100, 1_000, 10_000])
    parser.add_argument('--window', type=int, default=50)
    parser.add_argument('--long-rounds', type=int, default=1)
    parser.add_argument('--timeout', type=float, default=600.0, help='seconds one measurement may take')
    parser.add_argument('--no-write', action='store_true', help=f'do not write {RESULTS.name}')
    args = parser.parse_args()
    check_workload()
    python, versions = reference_python(args.python)
    machine = f'{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs'
    print(f'{versions}; {machine}', flush=True)
    sections = [
        f'## Concurrency (workload of bench_concurrency.py)\n\nMedians of {args.rounds} interleaved rounds.\n\n'
        + '\n'.join(concurrency(python, args))
    ]
    if args.long_steps > 0:
        table = '\n'.join(long_run(python, args))
        sections.append(
            f'## Long run (workload of bench_long_run.py)\n\n{args.long_rounds} round(s), '
            f'window of {args.window} steps.\n\n{table}'
        )
    print('\n\n'.join(sections))
    if not args.no_write:
        RESULTS.write_text(
            f'# bench_reference results\n\n`uv run python bench/bench_reference.py {" ".join(sys.argv[1:])}`\n\n'
            f'{versions}; {machine}. Timeout {args.timeout:.0f} s per measurement.\n\n' + '\n\n'.join(sections) + '\n'
        )


if __name__ == '__main__':
    main()
