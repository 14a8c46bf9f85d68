"""Whether persistence's cost per step stays flat as one run grows to 10,000 steps.

Not a test: run `uv run python bench/bench_long_run.py [--steps 10000] [--backends memory sqlite file]`.

One agent run of N tool steps (the workload of `bench_steps.py`: a real `Agent` on a
`FunctionModel`, one tool call per step, 2 KB tool returns; the model reports its usage, as a real
one does, so pydantic-ai does not estimate tokens over the whole history at every step). What is
measured is persistence's own time per step: the time spent inside `StepPersistence`'s hooks,
store writes included (`hook_timer.py`), since pydantic-ai's own cost per step grows with the
history. At each mark (steps 100, 1,000, 10,000) the table gives the median of the hook time of
the `--window` steps up to the mark, its ratio to the first mark, and the bytes the store holds
on disk at that step, per step stored. Each backend runs in a fresh interpreter; with `--rounds`
above 1 backends are interleaved and medians over rounds are given.

`--encryption` runs every backend twice per round, interleaved: as it is (checksums on every
record) and with `encryption=` (AES-GCM). A second table gives, per mode, the hook time per step
at the last mark, the whole run's process CPU per step, and the CPU per step spent sealing and
opening bodies (`stepcore.engine._seal`: checksums, or encryption), measured in the thread that
does it.
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
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage, UsageLimits

sys.path.insert(0, str(Path(__file__).parent))

from bench_steps import BACKENDS, available, dir_size, fresh_cell, tool_text
from hook_timer import TimedPersistence

RESULTS = Path(__file__).with_name('results-long-run.md')


def _count_sealing() -> list[float]:
    """Wrap the engine's sealing so the CPU it takes (in the calling thread) adds up in the list."""
    from stepcore.engine import _seal as seal

    spent = [0.0]
    for name in ('record', 'open_record', 'nodes', 'open_nodes'):
        method = getattr(seal.Sealer, name)

        def timed(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[0] += time.thread_time() - start

        setattr(seal.Sealer, name, timed)
    return spent


async def run_once(
    backend_name: str, steps: int, marks: list[int], window: int, encrypted: bool = False
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f'bench-long-{backend_name}-'))
    try:
        options: dict[str, Any] = {}
        if encrypted:
            from stepcore import Encryption

            options['encryption'] = Encryption(keys={'bench': Encryption.generate_key()})
        sealing = _count_sealing()
        backend = BACKENDS[backend_name](tmp, **options)
        assert backend.store is not None
        sink: list[list[float]] = []
        timed = TimedPersistence(store=backend.store)
        timed.sink = sink
        sizes: dict[int, int] = {}
        calls = 0

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            nonlocal calls
            calls += 1
            if calls - 1 in marks and backend_name in ('sqlite', 'file'):
                sizes[calls - 1] = dir_size(tmp)  # what steps 1..calls-1 left on disk
            usage = RequestUsage(input_tokens=10, output_tokens=5)
            if calls <= steps:
                return ModelResponse(parts=[ToolCallPart('fetch', {'i': calls}, tool_call_id=f'c{calls}')], usage=usage)
            return ModelResponse(parts=[TextPart('done')], usage=usage)

        agent: Agent[None, str] = Agent(FunctionModel(model), capabilities=[timed])

        @agent.tool_plain
        def fetch(i: int) -> str:  # pyright: ignore[reportUnusedFunction]
            return tool_text(i)

        await backend.store.list_runs()
        cpu = time.process_time()
        result = await agent.run('go', usage_limits=UsageLimits(request_limit=None))
        cpu = time.process_time() - cpu
        if result.output != 'done':
            raise RuntimeError('unexpected output')
        await backend.close()
        per_step = sink[0]
        out: dict[str, Any] = {}
        for mark in marks:
            chunk = per_step[max(0, mark - window) : mark]
            out[str(mark)] = {'median': statistics.median(chunk), 'bytes': sizes.get(mark)}
        out['cpu_per_step'] = cpu / steps
        out['seal_per_step'] = sealing[0] / steps
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_cell(backend_name: str, steps: int, marks: list[int], window: int, encrypted: bool = False) -> dict[str, Any]:
    mode = 'encrypted' if encrypted else 'plain'
    return fresh_cell(__file__, backend_name, backend_name, steps, ','.join(map(str, marks)), window, mode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--steps', type=int, default=10_000)
    parser.add_argument('--marks', type=int, nargs='+', default=[100, 1_000, 10_000])
    parser.add_argument('--window', type=int, default=50)
    parser.add_argument('--rounds', type=int, default=1)
    parser.add_argument('--backends', nargs='+', default=['memory', 'sqlite', 'file'])
    parser.add_argument('--no-write', action='store_true')
    parser.add_argument('--encryption', action='store_true', help='also run each backend with encryption=')
    parser.add_argument('--cell', nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        name, steps, marks, window, mode = args.cell
        marks_list = [int(m) for m in marks.split(',')]
        cell = asyncio.run(run_once(name, int(steps), marks_list, int(window), mode == 'encrypted'))
        print(json.dumps(cell))
        return
    if args.encryption:
        _compare_encryption(args)
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
        first = statistics.median(c[str(marks[0])]['median'] for c in cells[name])
        for mark in marks:
            median = statistics.median(c[str(mark)]['median'] for c in cells[name])
            sizes = [c[str(mark)]['bytes'] for c in cells[name] if c[str(mark)]['bytes'] is not None]
            per_step = f'{statistics.median(sizes) / mark:,.0f} B' if sizes else '-'
            rows.append(f'| {name} | {mark:,} | {median * 1000:.3f} ms | {median / first:.2f}x | {per_step} |')
    table = '\n'.join(
        [
            '| backend | step | persistence time per step (median) | vs first mark | bytes on disk per step |',
            '|---|---|---|---|---|',
            *rows,
        ]
    )
    print(table)
    if not args.no_write:
        RESULTS.write_text(
            f'# bench_long_run results\n\n`uv run python bench/bench_long_run.py {" ".join(sys.argv[1:])}`\n\n'
            f'Python {platform.python_version()}, {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs. '
            f'{args.rounds} round(s), window of {args.window} steps.\n\n{table}\n'
        )


def _compare_encryption(args: argparse.Namespace) -> None:
    marks = [m for m in args.marks if m <= args.steps]
    last = str(marks[-1])
    backends = [b for b in available(args.backends) if b in ('memory', 'sqlite', 'file')]
    cells: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for name in backends:
            for encrypted in (False, True):
                cell = run_cell(name, args.steps, marks, args.window, encrypted)
                cells.setdefault((name, encrypted), []).append(cell)
                print(f'{name} {"encrypted" if encrypted else "plain"}: {cell}', flush=True)
    rows: list[str] = []
    for name in backends:
        for encrypted in (False, True):
            runs = cells[(name, encrypted)]
            wall = statistics.median(c[last]['median'] for c in runs)
            cpu = statistics.median(c['cpu_per_step'] for c in runs)
            seal = statistics.median(c['seal_per_step'] for c in runs)
            mode = 'encrypted' if encrypted else 'checksums'
            rows.append(f'| {name} | {mode} | {wall * 1000:.3f} ms | {cpu * 1000:.3f} ms | {seal * 1000:.3f} ms |')
    table = '\n'.join(
        [
            f'| backend | bodies | hook time per step at step {int(last):,} (median) | process CPU per step | '
            'sealing CPU per step |',
            '|---|---|---|---|---|',
            *rows,
        ]
    )
    print(table)


if __name__ == '__main__':
    main()
