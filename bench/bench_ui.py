"""How fast `stepcore ui` serves a long run from SQLite.

Not a test: run `uv run python bench/bench_ui.py [--events 10000] [--repeat 15]`. It runs a real
agent (pydantic-ai `FunctionModel`, several tool calls per step, `StepPersistence` on SQLite with
`max_snapshots_per_run=20`) until the run has at least the asked number of events, adds 300 short
runs around it, starts `stepcore ui --port 0` in a child process and times GET requests for each
page over HTTP, reporting the median and the slowest of the repeats in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pydantic_ai import Agent, UsageLimits
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence

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
            ToolCallPart('measure', {'probe': f'p{step}-{i}'}, tool_call_id=f'c{step}-{i}') for i in range(CALLS_PER_STEP)
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


def start_ui(database: Path) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, '-m', 'stepcore.cli', 'ui', '--store', f'sqlite:///{database}', '--port', '0']
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r'http://\S+/', line)
    if not found:
        proc.kill()
        raise SystemExit(f'stepcore ui did not start: {line}{proc.stdout.read()}')
    return proc, found.group(0).rstrip('/')


def timed(url: str, repeat: int) -> tuple[float, float, int]:
    samples: list[float] = []
    size = 0
    for _ in range(repeat):
        start = time.perf_counter()
        with urllib.request.urlopen(url) as response:
            size = len(response.read())
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), max(samples), size


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
        proc, base = start_ui(database)
        try:
            with urllib.request.urlopen(f'{base}/runs/{RUN_ID}/timeline') as response:
                page = response.read().decode()
            total = int(re.search(r'(\d+) events over', page).group(1))  # type: ignore[union-attr]
            last = -(-total // 100)
            with urllib.request.urlopen(f'{base}/runs/{RUN_ID}') as response:
                seqs = [int(s) for s in re.findall(rf'/runs/{RUN_ID}/snapshots/(\d+)"', response.read().decode())]
            pages = [
                ('runs, first page (301 runs)', '/'),
                ('runs, filtered by agent', '/?agent=prober'),
                ('runs, filtered by status (reads every run)', '/?status=completed'),
                ('run overview (ledger page of 200, lineage, recovery)', f'/runs/{RUN_ID}'),
                ('timeline, first page of 100 events', f'/runs/{RUN_ID}/timeline'),
                ('timeline, middle page', f'/runs/{RUN_ID}/timeline?page={last // 2}'),
                ('timeline, last page', f'/runs/{RUN_ID}/timeline?page={last}'),
                ('newest snapshot (last 200 messages, diff)', f'/runs/{RUN_ID}/snapshots/{max(seqs)}'),
            ]
            print(f'SQLite, one run of {total} events ({CALLS_PER_STEP} tool calls per step, 20 snapshots kept)')
            print(f'plus 300 short runs; built in {built:.1f} s; {args.repeat} GETs per page, {os.cpu_count()} CPUs')
            print()
            print('| page | median ms | slowest ms | HTML KiB |')
            print('|---|---:|---:|---:|')
            for label, path in pages:
                median, worst, size = timed(base + path, args.repeat)
                print(f'| {label} | {median:.0f} | {worst:.0f} | {size / 1024:.0f} |')
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == '__main__':
    main()
