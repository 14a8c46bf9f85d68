"""What step persistence costs an agent run, per backend.

Not a test: run `uv run python bench/bench_steps.py [--steps 50 200 1000] [--backends none memory sqlite]`.

A real `pydantic_ai.Agent` on a `FunctionModel` calls one tool per step for N steps; each tool
returns 2 KB of text. The same run is timed with no persistence and with `StepPersistence` on each
backend. Each run is a fresh interpreter; the store is opened (connection, schema) before the
timed run starts, so the figures are the cost of persisting steps, not of opening a database.
Reported per backend and N: the best wall time of the repeated runs and time per step, the median over
rounds of each run's time over the unpersisted run of the same round, the process CPU
time (all threads; a busy machine inflates wall time but hardly CPU time), bytes the store holds
on disk right after the run with the store still open (SQLite's `-wal` and `-shm` files included)
and once it is closed, and how much the process's resident memory grew at its peak during the
run. Results are printed as a Markdown table and written to `bench/results.md`.

Backends are a dict of small factories; a backend whose package or server is absent is skipped
with a printed note. MongoDB, PostgreSQL and Redis are used when `STEP_MONGO_URL` /
`STEP_POSTGRES_URL` / `STEP_REDIS_URL` point at a server (see `scripts/`); Redis's size is the
server memory its keys take.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from stepcore import InMemoryStepStore, StepStore
from stepcore.capability import StepPersistence

TOOL_RETURN_BYTES = 2048
RESULTS = Path(__file__).with_name('results.md')


# -- the workload ----------------------------------------------------------------------------


def tool_text(i: int) -> str:
    """2 KB of distinct text for step `i`: random hex, which compresses to about half (real text compresses more)."""
    return random.Random(i).randbytes(TOOL_RETURN_BYTES // 2).hex()


def build_agent(steps: int, capabilities: list[Any]) -> Agent[None, str]:
    calls = 0

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls <= steps:
            return ModelResponse(parts=[ToolCallPart('fetch', {'i': calls}, tool_call_id=f'call-{calls}')])
        return ModelResponse(parts=[TextPart('done')])

    agent: Agent[None, str] = Agent(FunctionModel(model), capabilities=capabilities)

    @agent.tool_plain
    def fetch(i: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return tool_text(i)

    return agent


async def run_all(agents: list[Agent[None, str]]) -> tuple[float, float]:
    """Run `agents` at once on this event loop, after a garbage collection; their wall and process
    CPU seconds. `RuntimeError` when a run does not end with the workload's output."""
    gc.collect()
    start = time.perf_counter()
    cpu_start = time.process_time()
    results = await asyncio.gather(*(agent.run('go', usage_limits=UsageLimits(request_limit=None)) for agent in agents))
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    if any(r.output != 'done' for r in results):
        raise RuntimeError('unexpected output')
    return seconds, cpu


# -- backends --------------------------------------------------------------------------------


@dataclass
class Backend:
    store: StepStore | None
    size: Callable[[], Awaitable[int | None]]
    close: Callable[[], Coroutine[Any, Any, None]]


async def _none_size() -> int | None:
    return None


async def _nothing() -> None:
    return None


def dir_size(path: Path) -> int:
    """Bytes of every file under `path`."""
    return sum(p.stat().st_size for p in path.rglob('*') if p.is_file())


def fresh_cell(script: str, what: str, *args: object, env: dict[str, str] | None = None) -> Any:
    """Run `script --cell *args` in a fresh interpreter (with `env`, else this one's environment), so
    memory and caches start from the same state every time, and return the JSON of its last output
    line; `RuntimeError` naming `what` with the child's stderr when it fails."""
    out = subprocess.run(
        [sys.executable, script, '--cell', *map(str, args)], capture_output=True, text=True, check=False, env=env
    )
    if out.returncode != 0:
        raise RuntimeError(f'{what} failed:\n{out.stderr}')
    return json.loads(out.stdout.strip().splitlines()[-1])


def make_none(tmp: Path) -> Backend:
    return Backend(None, _none_size, _nothing)


def make_memory(tmp: Path, **options: Any) -> Backend:
    return Backend(InMemoryStepStore(**options), _none_size, _nothing)


def make_sqlite(tmp: Path, **options: Any) -> Backend:
    from step_sqlite import SqliteStepStore

    store = SqliteStepStore(database=tmp / 'runs.db', **options)

    async def size() -> int:
        return dir_size(tmp)

    return Backend(store, size, store.aclose)


def make_file(tmp: Path, **options: Any) -> Backend:
    from step_file import FileStepStore  # pyright: ignore[reportMissingImports, reportUnknownVariableType]

    store: StepStore = FileStepStore(tmp / 'runs', **options)  # pyright: ignore[reportUnknownVariableType]

    async def size() -> int:
        return dir_size(tmp)

    return Backend(store, size, store.aclose)


def _server_url(variable: str, script: str) -> str:
    """The server URL in environment variable `variable`; `LookupError` naming the start script when unset."""
    url = os.environ.get(variable)
    if not url:
        raise LookupError(f'{variable} is not set (start a server with scripts/{script})')
    return url


def make_mongo(tmp: Path) -> Backend:
    url = _server_url('STEP_MONGO_URL', 'mongo-server.sh')
    from step_mongo import MongoStepStore  # pyright: ignore[reportMissingImports, reportUnknownVariableType]

    name = f'bench_{uuid.uuid4().hex[:12]}'
    store: Any = MongoStepStore(db_url=url, database=name)

    async def size() -> int | None:
        try:
            stats = await store.database.command('dbStats')
            return int(stats.get('storageSize', 0)) + int(stats.get('indexSize', 0))
        except Exception:
            return None

    async def close() -> None:
        try:
            await store.client.drop_database(name)
        finally:
            await store.aclose()

    return Backend(store, size, close)


def make_postgres(tmp: Path) -> Backend:
    dsn = _server_url('STEP_POSTGRES_URL', 'postgres-server.sh')
    from step_postgres import PostgresStepStore  # pyright: ignore[reportMissingImports, reportUnknownVariableType]

    prefix = f'bench_{uuid.uuid4().hex[:10]}'
    store: Any = PostgresStepStore(dsn=dsn, table_prefix=prefix)

    async def size() -> int | None:
        try:
            import psycopg  # pyright: ignore[reportMissingImports]

            async with await psycopg.AsyncConnection.connect(dsn) as conn:  # pyright: ignore
                cur = await conn.execute(  # pyright: ignore
                    'SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c '
                    "WHERE c.relkind = 'r' AND c.relname LIKE %s",
                    (prefix + '%',),
                )
                row = await cur.fetchone()  # pyright: ignore
                return int(row[0])  # pyright: ignore
        except Exception:
            return None

    async def close() -> None:
        try:
            import psycopg  # pyright: ignore[reportMissingImports]

            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:  # pyright: ignore
                cur = await conn.execute(  # pyright: ignore
                    'SELECT tablename FROM pg_tables WHERE tablename LIKE %s', (prefix + '%',)
                )
                for (table,) in await cur.fetchall():  # pyright: ignore
                    await conn.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')  # pyright: ignore
        finally:
            await store.aclose()

    return Backend(store, size, close)


def make_redis(tmp: Path) -> Backend:
    url = _server_url('STEP_REDIS_URL', 'redis-server.sh')
    from step_redis import RedisStepStore  # pyright: ignore[reportMissingImports, reportUnknownVariableType]

    prefix = f'bench_{uuid.uuid4().hex[:10]}'
    store: Any = RedisStepStore(url=url, key_prefix=prefix)

    async def keys() -> list[Any]:
        return [key async for key in store.client.scan_iter(match=f'{prefix}:*', count=1000)]

    async def size() -> int | None:
        """Bytes of the server's memory the prefix's keys take (Redis keeps its data in memory)."""
        try:
            total = 0
            for key in await keys():
                total += int(await store.client.memory_usage(key) or 0)
            return total
        except Exception:
            return None

    async def close() -> None:
        try:
            found = await keys()
            if found:
                await store.client.delete(*found)
        finally:
            await store.aclose()

    return Backend(store, size, close)


BACKENDS: dict[str, Callable[..., Backend]] = {
    'none': make_none,
    'memory': make_memory,
    'sqlite': make_sqlite,
    'file': make_file,
    'mongo': make_mongo,
    'postgres': make_postgres,
    'redis': make_redis,
}


# -- measuring -------------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    cpu: float
    """Process CPU time of the run, all threads (less sensitive to a busy machine than wall time)."""
    size: int | None
    """Bytes on disk right after the run, store still open (SQLite: db + -wal + -shm)."""
    closed_size: int | None
    """Bytes on disk once the store is closed."""
    peak_rss: int
    """Peak resident memory during the run minus resident memory just before it (bytes)."""


def _rss() -> int:
    """Current resident memory (Linux `/proc`; elsewhere the process high-water mark)."""
    try:
        with open('/proc/self/statm') as statm:
            return int(statm.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _RssSampler(threading.Thread):
    """Samples resident memory every 20 ms while a run is going."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.base = _rss()
        self.peak = self.base
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, _rss())

    def stop(self) -> int:
        self.done.set()
        self.join()
        return max(self.peak, _rss()) - self.base


async def run_once(backend_name: str, steps: int) -> Sample:
    tmp = Path(tempfile.mkdtemp(prefix=f'bench-{backend_name}-'))
    try:
        backend = BACKENDS[backend_name](tmp)
        capabilities: list[Any] = [StepPersistence(store=backend.store)] if backend.store is not None else []
        agent = build_agent(steps, capabilities)
        if backend.store is not None:
            await backend.store.list_runs()  # open the connection and create the schema before timing
        gc.collect()
        sampler = _RssSampler()
        sampler.start()
        start = time.perf_counter()
        cpu_start = time.process_time()
        result = await agent.run('go', usage_limits=UsageLimits(request_limit=None))
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        peak_rss = sampler.stop()
        if result.output != 'done':
            raise RuntimeError(f'unexpected output {result.output!r}')
        size = await backend.size()
        if backend.store is not None:
            (run,) = await backend.store.list_runs()
            latest = await backend.store.latest_snapshot(run.run_id)
            if latest is None or len(latest.messages) < 2 * steps:
                raise RuntimeError(f'{backend_name}: the store lost the history')
        await backend.close()
        closed_size = await backend.size() if size is not None and backend_name in ('sqlite', 'file') else None
        return Sample(seconds, cpu, size, closed_size, peak_rss)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_cell(backend_name: str, steps: int) -> Sample:
    """One run in a fresh interpreter."""
    return Sample(**fresh_cell(__file__, f'{backend_name} at {steps} steps', backend_name, steps))


def available(names: list[str]) -> list[str]:
    usable: list[str] = []
    for name in names:
        if name not in BACKENDS:
            print(f'note: unknown backend {name!r} (known: {", ".join(BACKENDS)}); skipped')
            continue
        tmp = Path(tempfile.mkdtemp(prefix='bench-probe-'))
        try:
            backend = BACKENDS[name](tmp)
            asyncio.run(backend.close())
        except (ImportError, LookupError, OSError) as exc:
            print(f'note: backend {name!r} skipped: {exc}')
            continue
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        usable.append(name)
    return usable


def paired_ratio(samples: list[Sample], baseline: list[Sample]) -> str:
    """The median, over rounds, of this backend's time over the unpersisted run's time in the same round.

    Backends run interleaved, so the two runs of a round see the machine in about the same state:
    the median of those ratios is not moved by one unusually fast or slow run, as best-of can be.
    """
    if len(samples) < 2 or len(samples) != len(baseline):
        return '-'
    return f'{statistics.median(s.seconds / b.seconds for s, b in zip(samples, baseline, strict=True)):.2f}x'


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return '-'
    if n >= 1024 * 1024:
        return f'{n / 1024 / 1024:.2f} MB'
    return f'{n / 1024:.0f} KB'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--steps', type=int, nargs='+', default=[50, 200, 1000])
    parser.add_argument('--backends', nargs='+', default=list(BACKENDS))
    parser.add_argument('--repeat', type=int, default=3, help='timed runs per cell for N <= 200 (the best is reported)')
    parser.add_argument('--no-write', action='store_true', help=f'do not write {RESULTS.name}')
    parser.add_argument('--cell', nargs=2, metavar=('BACKEND', 'STEPS'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        print(json.dumps(asdict(asyncio.run(run_once(args.cell[0], int(args.cell[1]))))))
        return
    backends = available(args.backends)
    rows: list[str] = []
    baseline: dict[int, float] = {}
    cpu_baseline: dict[int, float] = {}
    print(
        f'python {platform.python_version()}, {platform.system()} {platform.machine()}, {os.cpu_count()} cpus',
        flush=True,
    )
    for steps in args.steps:
        repeat = max(1, args.repeat if steps <= 200 else 1)
        samples: dict[str, list[Sample]] = {b: [] for b in backends}
        for _ in range(repeat):  # interleave backends so drift hits all of them alike
            for name in list(backends):
                try:
                    samples[name].append(run_cell(name, steps))
                except RuntimeError as exc:
                    print(f'note: backend {name!r} dropped: {exc}', flush=True)
                    backends.remove(name)
        for name in backends:
            peak = max(s.peak_rss for s in samples[name])
            seconds = min(s.seconds for s in samples[name])
            cpu = min(s.cpu for s in samples[name])
            size = samples[name][-1].size
            closed = samples[name][-1].closed_size
            if name == 'none':
                baseline[steps] = seconds
                cpu_baseline[steps] = cpu
            ratio = f'{seconds / baseline[steps]:.2f}x' if steps in baseline else '-'
            paired = paired_ratio(samples[name], samples.get('none', []))
            cpu_ratio = f'{cpu / cpu_baseline[steps]:.2f}x' if steps in cpu_baseline else '-'
            row = (
                f'| {name} | {steps} | {seconds:.3f} s | {seconds / steps * 1000:.2f} ms | {ratio} | {paired} | '
                f'{cpu:.3f} s | {cpu_ratio} | '
                f'{fmt_bytes(size)} | {fmt_bytes(closed)} | {fmt_bytes(peak)} |'
            )
            rows.append(row)
            print(row, flush=True)
    header = [
        '| backend | steps | wall time | per step | vs none | vs none, median of rounds | CPU time | CPU vs none '
        '| on disk, open | on disk, closed | peak RSS growth |',
        '|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    table = '\n'.join(header + rows)
    print()
    print(table)
    if not args.no_write:
        RESULTS.write_text(
            f'# bench_steps results\n\n`uv run python bench/bench_steps.py {" ".join(sys.argv[1:])}`'.rstrip()
            + f'\n\nPython {platform.python_version()}, {platform.system()} {platform.machine()}, '
            f'{os.cpu_count()} CPUs. Best of {args.repeat} interleaved runs for N <= 200 (and the median of per-round '
            'ratios), one run for larger N.\n\n' + table + '\n'
        )


if __name__ == '__main__':
    main()
