"""How much of a persisted step's cost is stepcore's own, against two floors under it.

Not a test: run `uv run python bench/bench_floor.py [--runs 50] [--steps 40] [--rounds 5]`.

The workload of `bench_concurrency.py` (K runs of N tool steps on one event loop), in fresh
interpreters, rounds interleaved, medians of: wall time, process CPU time, and the CPU added per
step over the unpersisted run of the same round. The cells:

- `none`: no capability.
- `hooks`: one capability that does nothing. pydantic-ai calls every hook of every capability
  (copying the run context for each), so this is what any capability costs, before it does
  anything.
- `floor`: a capability that keeps the crash rule with the least work this design allows, on raw
  `sqlite3` (WAL, `synchronous=NORMAL`, one connection, on the event loop): before each tool body
  one transaction storing the call's `started` row and an event; after each settled tool cycle one
  transaction storing the new messages (encoded once by pydantic-ai's own adapter), a snapshot
  row, the call's `completed` row and an event. No checksums, no lease, no idempotency keys, no
  compression, no recovery, no damage detection, no events to the run's stream: a lower bound for
  any store that commits each boundary to SQLite, not a store.
- `memory`, `sqlite`: `StepPersistence` on `InMemoryStepStore` and `SqliteStepStore`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessagesTypeAdapter, ToolCallPart
from pydantic_ai.tools import ToolDefinition

sys.path.insert(0, str(Path(__file__).parent))

from bench_steps import BACKENDS, build_agent, fresh_cell, run_all

CELLS = ('none', 'hooks', 'floor', 'memory', 'sqlite')

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (run_id TEXT, seq INTEGER, body BLOB, PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS snapshots (run_id TEXT, seq INTEGER, length INTEGER, PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS ledger (run_id TEXT, call_id TEXT, status TEXT, PRIMARY KEY (run_id, call_id));
CREATE TABLE IF NOT EXISTS events (run_id TEXT, seq INTEGER, kind TEXT, PRIMARY KEY (run_id, seq));
"""


@dataclass(init=False)
class DoNothing(AbstractCapability[Any]):
    """A capability with no behaviour of its own."""


@dataclass(init=False)
class Floor(AbstractCapability[Any]):
    """The least a capability can write to keep the crash rule on SQLite (see the module docstring)."""

    connection: sqlite3.Connection
    saved: dict[str, int]
    events: dict[str, int]
    finished: dict[str, str]

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.saved = {}
        self.events = {}
        self.finished = {}

    def _event(self, run_id: str, kind: str) -> None:
        seq = self.events[run_id] = self.events.get(run_id, 0) + 1
        self.connection.execute('INSERT INTO events VALUES (?, ?, ?)', (run_id, seq, kind))

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any, handler: Any
    ) -> Any:
        run_id = ctx.run_id or ''
        with self.connection:
            self.connection.execute('INSERT INTO ledger VALUES (?, ?, ?)', (run_id, call.tool_call_id, 'started'))
            self._event(run_id, 'tool_call_started')
        result = await handler(args)
        self.finished[run_id] = call.tool_call_id
        return result

    async def after_node_run(self, ctx: RunContext[Any], *, node: Any, result: Any) -> Any:
        run_id = ctx.run_id or ''
        call_id = self.finished.pop(run_id, None)
        if call_id is None:
            return result
        messages = ctx.messages
        start = self.saved.get(run_id, 0)
        body = ModelMessagesTypeAdapter.dump_json(messages[start:])
        with self.connection:
            self.connection.execute('INSERT INTO messages VALUES (?, ?, ?)', (run_id, len(messages), body))
            self.connection.execute('INSERT INTO snapshots VALUES (?, ?, ?)', (run_id, len(messages), len(messages)))
            self.connection.execute(
                'UPDATE ledger SET status = ? WHERE run_id = ? AND call_id = ?', ('completed', run_id, call_id)
            )
            self._event(run_id, 'tool_call_completed')
        self.saved[run_id] = len(messages)
        return result


def open_floor(path: Path) -> sqlite3.Connection:
    """The floor's database at `path`, its schema made and its WAL created (before any timing)."""
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute('PRAGMA journal_mode=WAL')
    connection.execute('PRAGMA synchronous=NORMAL')
    connection.executescript(_SCHEMA)
    connection.execute("INSERT INTO events VALUES ('', 0, 'opened')")
    connection.isolation_level = 'IMMEDIATE'
    return connection


@dataclass
class Sample:
    seconds: float
    cpu: float


async def run_once(cell: str, runs: int, steps: int) -> Sample:
    tmp = Path(tempfile.mkdtemp(prefix=f'bench-floor-{cell}-'))
    try:
        capabilities: list[Any] = []
        close: Any = None
        connection: sqlite3.Connection | None = None
        if cell == 'hooks':
            capabilities.append(DoNothing())
        elif cell == 'floor':
            connection = open_floor(tmp / 'floor.db')
            capabilities.append(Floor(connection))
            close = connection.close
        elif cell != 'none':
            from stepcore import StepPersistence

            backend = BACKENDS[cell](tmp)
            assert backend.store is not None
            await backend.store.list_runs()
            capabilities.append(StepPersistence(store=backend.store))
            close = backend.close
        agents = [build_agent(steps, capabilities) for _ in range(runs)]
        seconds, cpu = await run_all(agents)
        if connection is not None:
            stored = connection.execute("SELECT COUNT(*) FROM ledger WHERE status = 'completed'").fetchone()[0]
            if stored != runs * steps:
                raise RuntimeError(f'floor: {stored} completed calls stored, expected {runs * steps}')
        if close is not None:
            outcome = close()
            if asyncio.iscoroutine(outcome):
                await outcome
        return Sample(seconds, cpu)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--runs', type=int, default=50)
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--cell', nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        name, runs, steps = args.cell
        print(json.dumps(asdict(asyncio.run(run_once(name, int(runs), int(steps))))))
        return
    samples: dict[str, list[Sample]] = {cell: [] for cell in CELLS}
    for i in range(args.rounds):
        order = [*CELLS[i % len(CELLS) :], *CELLS[: i % len(CELLS)]]
        for cell in order:
            samples[cell].append(Sample(**fresh_cell(__file__, cell, cell, args.runs, args.steps)))
            print(f'round {i + 1} {cell}: {samples[cell][-1]}', flush=True)
    total = args.runs * args.steps
    base = samples['none']
    print(f'\n{args.runs} runs x {args.steps} steps, medians of {args.rounds} interleaved rounds\n')
    print('| cell | wall | CPU | wall vs none | added CPU/step |')
    print('|---|---|---|---|---|')
    for cell, cells in samples.items():
        wall = statistics.median(s.seconds for s in cells)
        cpu = statistics.median(s.cpu for s in cells)
        ratio = statistics.median(s.seconds / b.seconds for s, b in zip(cells, base, strict=True))
        added = statistics.median((s.cpu - b.cpu) / total for s, b in zip(cells, base, strict=True))
        extra = '-' if cell == 'none' else f'{added * 1000:.2f} ms'
        print(f'| {cell} | {wall:.2f} s | {cpu:.2f} s | {ratio:.2f}x | {extra} |')


if __name__ == '__main__':
    main()
