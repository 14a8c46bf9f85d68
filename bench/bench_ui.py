"""How fast `stepcore ui` serves a long run from SQLite.

Not a test: run `uv run python bench/bench_ui.py [--events 10000] [--repeat 15]`. It runs a real
agent (pydantic-ai `FunctionModel`, several tool calls per step, `StepPersistence` on SQLite with
`max_snapshots_per_run=20`) until the run has at least the asked number of events, adds 300 short
runs around it, then sends GET requests for each page through the app's ASGI interface (what
uvicorn calls; loopback HTTP adds about a millisecond) and reports, per page, the median wall time,
the median CPU time of the process (all threads, the SQLite one included: what the page costs when
the machine is not shared) and the slowest wall time. `--database PATH` keeps the database to
measure again without rebuilding it (the build takes minutes: pydantic-ai's own per-step work
grows with the history).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, UsageLimits
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence
from stepcore.ui import create_app

CALLS_PER_STEP = 8
RUN_ID = 'long-run'
# per step: model request started + completed, and a started + completed pair per tool call
EVENTS_PER_STEP = 2 + 2 * CALLS_PER_STEP


def _steps_for(events: int) -> int:
    return -(-(events - 2) // EVENTS_PER_STEP)


def _model(steps: int):  # type: ignore[no-untyped-def]
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del info
        done = sum(1 for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
        step = done // CALLS_PER_STEP
        if step >= steps:
            return ModelResponse(parts=[TextPart(f'finished after {step} steps')])
        calls = [
            ToolCallPart('measure', {'probe': f'p{step}-{i}'}, tool_call_id=f'c{step}-{i}')
            for i in range(CALLS_PER_STEP)
        ]
        return ModelResponse(parts=calls)

    return respond


async def build(database: Path, events: int) -> None:
    store = SqliteStepStore(database=database, max_snapshots_per_run=20)
    try:
        agent = Agent(
            FunctionModel(_model(_steps_for(events))), name='prober', capabilities=[StepPersistence(store=store)]
        )

        @agent.tool_plain
        def measure(probe: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'{probe}: ok'

        small = Agent(FunctionModel(_model(1)), name='helper', capabilities=[StepPersistence(store=store)])

        @small.tool_plain(name='measure')
        def measure_small(probe: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'{probe}: ok'

        for i in range(300):
            await small.run('check', run_id=f'short-{i:03d}', conversation_id=f'conv-{i % 30}')
        await agent.run(
            'probe everything', run_id=RUN_ID, conversation_id='conv-0', usage_limits=UsageLimits(request_limit=None)
        )
    finally:
        await store.aclose()


async def get(app: Any, path: str) -> tuple[int, bytes]:
    """One GET through the app's ASGI interface, as uvicorn would send it (no network in between)."""
    raw_path, _, query = path.partition('?')
    scope = {
        'type': 'http',
        'asgi': {'version': '3.0'},
        'http_version': '1.1',
        'method': 'GET',
        'scheme': 'http',
        'path': raw_path,
        'raw_path': raw_path.encode(),
        'query_string': query.encode(),
        'root_path': '',
        'headers': [(b'host', b'127.0.0.1:8765')],
        'client': ('127.0.0.1', 50000),
        'server': ('127.0.0.1', 8765),
    }
    status = 0
    body: list[bytes] = []

    async def receive() -> dict[str, Any]:
        return {'type': 'http.request', 'body': b'', 'more_body': False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message['type'] == 'http.response.start':
            status = message['status']
        elif message['type'] == 'http.response.body':
            body.append(message.get('body', b''))

    await app(scope, receive, send)
    return status, b''.join(body)


async def timed(app: Any, path: str, repeat: int, fresh: Any = None) -> tuple[float, float, float, int]:
    """Median wall ms, median CPU ms (this process, all threads), slowest wall ms, and the page size.

    With `fresh` (a function making a new app), each GET goes to a new inspector, which has kept nothing.
    """
    walls: list[float] = []
    cpus: list[float] = []
    size = 0
    for _ in range(repeat):
        if fresh is not None:
            app = fresh()
        wall, cpu = time.perf_counter(), time.process_time()
        status, body = await get(app, path)
        cpus.append((time.process_time() - cpu) * 1000)
        walls.append((time.perf_counter() - wall) * 1000)
        assert status == 200, (path, status, body[:300])
        size = len(body)
    return statistics.median(walls), statistics.median(cpus), max(walls), size


async def measure(database: Path, repeat: int) -> list[tuple[str, tuple[float, float, float, int]]]:
    store = SqliteStepStore(database=database)

    def fresh() -> Any:
        return create_app(store, store_url=f'sqlite:///{database}')

    app = fresh()
    try:
        total = len(await store.list_events(RUN_ID))
        last = -(-total // 100)
        newest = await store.latest_snapshot(RUN_ID, include_interrupted=True)
        assert newest is not None
        pages = [
            (f'runs, first page ({len(await store.list_runs())} runs)', '/'),
            ('runs, filtered by agent (the long run only)', '/?agent=prober'),
            ('runs, filtered by status (reads every run)', '/?status=completed'),
            ('run overview (recovery, ledger page of 200, lineage)', f'/runs/{RUN_ID}'),
            (f'timeline, first page of 100 of {total} events', f'/runs/{RUN_ID}/timeline'),
            ('timeline, middle page', f'/runs/{RUN_ID}/timeline?page={last // 2}'),
            ('timeline, last page', f'/runs/{RUN_ID}/timeline?page={last}'),
            ('snapshot list (20 retained)', f'/runs/{RUN_ID}/snapshots'),
            (
                f'newest snapshot ({len(newest.messages)} messages, 200 shown, diff), seen before',
                f'/runs/{RUN_ID}/snapshots/{newest.seq}',
            ),
        ]
        found = [(label, await timed(app, path, repeat)) for label, path in pages]
        first_view = 'newest snapshot, first view (an inspector that has kept nothing)'
        found.append((first_view, await timed(app, f'/runs/{RUN_ID}/snapshots/{newest.seq}', repeat, fresh)))
        oldest_page = 'newest snapshot, its first 200 messages, first view'
        found.append((oldest_page, await timed(app, f'/runs/{RUN_ID}/snapshots/{newest.seq}?page=1', repeat, fresh)))
        return found
    finally:
        await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--events', type=int, default=10_000)
    parser.add_argument('--repeat', type=int, default=15)
    parser.add_argument('--database', type=Path, help='keep the database here, and reuse it when it exists')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        database = args.database or Path(tmp) / 'ui-bench.db'
        start = time.perf_counter()
        if not database.exists():
            asyncio.run(build(database, args.events))
        built = time.perf_counter() - start
        rows = asyncio.run(measure(database, args.repeat))
        load = os.getloadavg()[0]
        print(f'SQLite: one run of {args.events}+ events ({CALLS_PER_STEP} tool calls per step, 20 snapshots kept)')
        print(f'and 300 short runs; built in {built:.0f} s. {args.repeat} GETs per page; {os.cpu_count()} CPUs,')
        print(f'load average {load:.1f} at the end (CPU ms is what a page costs whatever else the machine runs)')
        print()
        print('| page | median wall ms | median CPU ms | slowest wall ms | HTML KiB |')
        print('|---|---:|---:|---:|---:|')
        for label, (wall, cpu, worst, size) in rows:
            print(f'| {label} | {wall:.0f} | {cpu:.0f} | {worst:.0f} | {size / 1024:.0f} |')


if __name__ == '__main__':
    main()
