"""What each part of a persisted step costs, in instructions counted by valgrind's callgrind.

Not a test: run `uv run python bench/bench_parts.py [--steps 45] [--backends memory sqlite]`
(needs `valgrind`; about a minute per cell on a 2-CPU VM, two cells at a time).

Wall and CPU time on a shared VM move by more than one part of a step costs; instruction counts
do not. Each cell is one process under callgrind: imports, a warm-up (a short run with and one
without persistence), then one run of `--steps` tool steps, persisted or not. The instructions a
persisted run adds per step are the persisted cell's count minus the unpersisted one's, over the
steps. A part is taken out by patching it in the cell's process, never through an option of the
library (these are not settings a user has):

- `checksums`: records sealed with a sum of zeros, the canonical JSON still built; message sums zero;
- `compression`: message bodies stored as they are (SQLite);
- `recheck`: the newest saved messages are not re-encoded to be compared (`TAIL_RECHECK = 0`);
- `snapshot-saved`: no `SnapshotSaved` emitted;
- `events`, `ledger`: the step's events, or its ledger entries, not handed to the store;
- `gc`: the cyclic garbage collector off during the measured run (in its unpersisted cell too);
- `all-priced`: checksums, compression, recheck, snapshot-saved and gc at once.

Beside the instructions it prints the Python calls a persisted step adds (frames entered and
generators resumed, counted with `sys.setprofile` in a cell of its own, outside valgrind).

The backend `floor` is `bench_floor.py`'s least SQLite writer that keeps the crash rule.

With `--otel-sdk` every cell first sets a bare OpenTelemetry SDK tracer and meter provider (no span
processor, no metric reader, so nothing is exported): what stepcore's spans and metrics cost once an
application configures the SDK. Without it no provider is set, as in an application that configures
none.

Every cell sets `DEFERRED_WRITE_DELAY` to a minute: under callgrind the 10 ms timer would write
deferred records on their own at random points of the run, which moves the counts more than most
parts cost. At full speed this workload's deferred records travel with the run's next write.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic_ai.usage import UsageLimits

sys.path.insert(0, str(Path(__file__).parent))

from bench_steps import build_agent

PARTS = ('nothing', 'checksums', 'compression', 'recheck', 'snapshot-saved', 'events', 'ledger', 'gc', 'all-priced')
_COUNT_CALLS = 'BENCH_PARTS_COUNT_CALLS'
"""Set in a cell's environment: count its measured run's Python calls instead of running it under valgrind."""
_PRICED = ('checksums', 'compression', 'recheck', 'snapshot-saved', 'gc')


def applies(part: str, backend: str) -> bool:
    """Whether `backend` has `part` to take out (the floor has none; only SQLite compresses)."""
    if backend == 'floor':
        return part == 'nothing'
    return part != 'compression' or backend == 'sqlite'


def take_out(part: str, backend: str) -> set[str]:
    """Patch this process so `part` is left out of every step; the parts taken out."""
    parts = set(_PRICED) if part == 'all-priced' else {part}
    if 'checksums' in parts:
        import stepcore.engine._seal as seal_module
        from stepcore.store.codec import record_json

        zeros = b'0' * 16 + b'"'
        seal_module._sum = lambda data: '0' * 16  # pyright: ignore

        def seal(self: Any, record: Any, exclude: Any, columns: Any, clear: Any = (), extra: Any = None) -> bytes:
            rest = seal_module._sorted_json(record_json(record, exclude, extra))  # pyright: ignore
            return seal_module._SEALED_HEAD + zeros + b',' + rest[1:]  # pyright: ignore

        seal_module.Sealer.seal = seal  # pyright: ignore
    if 'compression' in parts and backend == 'sqlite':
        import step_sqlite.store as sqlite_store

        sqlite_store.pack_body = lambda body: body  # pyright: ignore
    if 'recheck' in parts:
        import stepcore.engine._history as history

        history.TAIL_RECHECK = 0  # pyright: ignore
    if 'snapshot-saved' in parts:
        import stepcore.capability.run_writer as run_writer

        async def announce(ctx: Any, snapshot: Any) -> None:
            return None

        run_writer.announce_snapshot = announce  # pyright: ignore
    if parts & {'events', 'ledger'}:
        import stepcore.capability.run_writer as run_writer
        from stepcore import StepEvent, ToolEffectRecord

        dropped = tuple(kind for kind, name in ((StepEvent, 'events'), (ToolEffectRecord, 'ledger')) if name in parts)
        write_records = run_writer.write_records

        async def without(store: Any, batch: Any, snapshot: Any = None, own: bool = False) -> None:
            kept = [write for write in batch if not isinstance(write, dropped)]
            await write_records(store, kept, snapshot=snapshot, own=own)

        run_writer.write_records = without  # pyright: ignore

        from stepcore.engine import EngineStore

        write_step = EngineStore.write_step

        async def step_without(self: Any, run_id: str, records: Any, snapshot: Any = None) -> None:
            await write_step(self, run_id, [write for write in records if not isinstance(write, dropped)], snapshot)

        EngineStore.write_step = step_without  # pyright: ignore
    return parts


def bare_sdk() -> None:
    """Set the OpenTelemetry SDK's tracer and meter providers, with nothing to export to."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    metrics.set_meter_provider(MeterProvider())


async def cell(backend: str, part: str, persisted: bool, steps: int) -> None:
    import stepcore.capability.run_writer as run_writer

    # Under callgrind a step takes some fifty times longer, so the timer that writes deferred records
    # on their own would fire at random points of the run; without it they travel with the run's
    # next write, as they do at full speed (about two writes per step).
    run_writer.DEFERRED_WRITE_DELAY = 60.0  # pyright: ignore
    parts = take_out(part, backend)
    tmp = Path(tempfile.mkdtemp(prefix='bench-parts-'))
    try:
        capabilities: list[Any]
        if backend == 'floor':
            from bench_floor import Floor, open_floor

            capabilities = [Floor(open_floor(tmp / 'floor.db'))]
        else:
            from bench_steps import BACKENDS

            from stepcore import StepPersistence

            store = BACKENDS[backend](tmp).store
            assert store is not None
            await store.list_runs()
            capabilities = [StepPersistence(store=store)]

        async def run(with_capabilities: list[Any], n: int) -> None:
            gc.collect()
            if 'gc' in parts:
                gc.disable()
            try:
                await build_agent(n, with_capabilities).run('go', usage_limits=UsageLimits(request_limit=None))
            finally:
                gc.enable()

        await run(capabilities, 3)
        await run([], 3)
        if os.environ.get(_COUNT_CALLS):
            calls = 0

            def counted(frame: Any, event: str, arg: Any) -> None:
                nonlocal calls
                if event == 'call':
                    calls += 1

            sys.setprofile(counted)
            try:
                await run(capabilities if persisted else [], steps)
            finally:
                sys.setprofile(None)
            print(f'calls {calls}')
            return
        await run(capabilities if persisted else [], steps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def python_calls(backend: str, persisted: bool, steps: int) -> int:
    """Python function calls (frames entered, generators resumed included) of one cell's measured run,
    counted with `sys.setprofile` in a fresh interpreter, without valgrind."""
    command = [sys.executable, __file__, '--cell', backend, 'nothing', 'persisted' if persisted else 'unpersisted']
    done = subprocess.run(
        [*command, str(steps)],
        capture_output=True,
        text=True,
        env={**os.environ, 'PYTHONHASHSEED': '0', _COUNT_CALLS: '1'},
    )
    found = re.search(r'calls (\d+)', done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f'cell {backend} (calls) failed:\n{done.stderr[-2000:]}')
    return int(found.group(1))


def count(backend: str, part: str, persisted: bool, steps: int, *, otel_sdk: bool = False) -> int:
    """Instructions of one cell's process under callgrind."""
    command = [
        'valgrind',
        '--tool=callgrind',
        '--callgrind-out-file=/dev/null',
        sys.executable,
        __file__,
        '--cell',
        backend,
        part,
        'persisted' if persisted else 'unpersisted',
        str(steps),
        *(['--otel-sdk'] if otel_sdk else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, 'PYTHONHASHSEED': '0'})
    found = re.search(r'Collected : (\d+)', done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f'cell {backend} {part} failed:\n{done.stderr[-2000:]}')
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--steps', type=int, default=45)
    parser.add_argument('--backends', nargs='+', default=['memory', 'sqlite'])
    parser.add_argument('--parts', nargs='+', default=list(PARTS), choices=PARTS)
    parser.add_argument('--jobs', type=int, default=2)
    parser.add_argument(
        '--otel-sdk', action='store_true', help='set a bare OpenTelemetry SDK tracer and meter provider in every cell'
    )
    parser.add_argument('--cell', nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        backend, part, mode, steps = args.cell
        if args.otel_sdk:
            bare_sdk()
        asyncio.run(cell(backend, part, mode == 'persisted', int(steps)))
        return
    if shutil.which('valgrind') is None:
        sys.exit('bench_parts: needs valgrind (apt-get install valgrind)')
    cells: list[tuple[str, str, bool]] = []
    for backend in args.backends:
        cells.append((backend, 'nothing', False))
        if backend != 'floor':
            cells.append((backend, 'gc', False))
        cells += [(backend, part, True) for part in {'nothing', *args.parts} if applies(part, backend)]
    with ThreadPoolExecutor(args.jobs) as pool:
        counted = pool.map(lambda c: count(c[0], c[1], c[2], args.steps, otel_sdk=args.otel_sdk), cells)
        counts = dict(zip(cells, counted, strict=True))
    sdk = ', a bare OpenTelemetry SDK provider set' if args.otel_sdk else ''
    print(f'\ninstructions added per step, one run of {args.steps} steps{sdk} (M)\n')
    print('| taken out | ' + ' | '.join(args.backends) + ' |')
    print('|---|' + '---:|' * len(args.backends))
    for part in args.parts:
        row: list[str] = []
        for backend in args.backends:
            if (backend, part, True) not in counts:
                row.append('—')
                continue
            base = counts[(backend, 'gc' if part in ('gc', 'all-priced') else 'nothing', False)]
            added = (counts[(backend, part, True)] - base) / args.steps / 1e6
            whole = (counts[(backend, 'nothing', True)] - counts[(backend, 'nothing', False)]) / args.steps / 1e6
            row.append(f'{added:.2f}' if part == 'nothing' else f'{added - whole:+.2f}')
        print(f'| {part} | ' + ' | '.join(row) + ' |')
    calls = [
        (python_calls(backend, True, args.steps) - python_calls(backend, False, args.steps)) / args.steps
        for backend in args.backends
    ]
    print('| Python calls added per step | ' + ' | '.join(f'{c:.0f}' for c in calls) + ' |')


if __name__ == '__main__':
    main()
