"""The zygote of the exactly-once kill test: `python exactly_once_zygote.py '<store spec json>' <world dir>`.

It imports stepcore, pydantic-ai and the backend once and runs the agent once on an in-memory
store, prints `ready`, then reads one job per line on stdin and forks a child for each (no event
loop, thread or store of the zygote is alive then). A job is
`{"story": s, "run_id": r, "resume": r0 | null, "kill_after": seconds | null}`: the child starts a
thread that SIGKILLs it after `kill_after` seconds, then either starts story `s` afresh under run
id `r` or resumes run `r0` with `resolve_run` and `Resumption.run`, recording the new run under `r`.
The zygote answers each job with one JSON line `{"exit": code}` (minus the signal that ended it;
`FINISHED` when the run to resume had already ended).

The agent works in three tool cycles, each two parallel calls, then answers:

- `add_row` (policy `'rerun'`) inserts a row keyed by its idempotency key into `world.db`; the
  table deduplicates downstream (`INSERT OR IGNORE`), and every attempt is counted in `attempts`;
- `append_note` (a reconcile function) appends a line to `notes.txt` with no deduplication at all;
  its reconcile function reads the file to tell whether the line is there.

Both tools sleep a little, and trace `enter`/`exit` lines to `trace-<run id>`, so the test can tell
whether a kill came inside a tool.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, cast

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import stepcore
from stepcore import (
    InMemoryStepStore,
    Reconciled,
    StepPersistence,
    StepStoreProtocol,
    ToolEffectRecord,
    annotate_tool_effect,
    recovery_policy,
    resolve_run,
)
from stepcore.plugins.registry import get_registry, load_factory
from stepcore_conformance.forkserver import serve

CYCLES = ('a', 'b', 'c')
FINAL = 'all written'
TOOL_SECONDS = 0.004


def _story(messages: list[ModelMessage]) -> str:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content.removeprefix('story ')
    raise AssertionError('no prompt')


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One cycle per letter in `CYCLES`, in order, by how many cycles already returned; then the answer."""
    returned = {
        part.tool_call_id
        for m in messages
        if isinstance(m, ModelRequest)
        for part in m.parts
        if isinstance(part, ToolReturnPart)
    }
    story = _story(messages)
    for letter in CYCLES:
        row, note = f'row-{letter}', f'note-{letter}'
        if row not in returned or note not in returned:
            return ModelResponse(
                parts=[
                    ToolCallPart('add_row', {'story': story, 'key': letter}, tool_call_id=row),
                    ToolCallPart('append_note', {'story': story, 'text': letter}, tool_call_id=note),
                ]
            )
    return ModelResponse(parts=[TextPart(FINAL)])


class World:
    """The outside world the tools change: a SQLite file and a text file, beside the test's store."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.notes = directory / 'notes.txt'
        self.database = directory / 'world.db'

    def setup(self) -> None:
        with sqlite3.connect(self.database) as db:
            db.execute('CREATE TABLE IF NOT EXISTS rows (key TEXT PRIMARY KEY)')
            db.execute('CREATE TABLE IF NOT EXISTS attempts (key TEXT)')

    def add_row(self, key: str) -> None:
        with sqlite3.connect(self.database, timeout=30) as db:
            db.execute('INSERT INTO attempts (key) VALUES (?)', (key,))
            db.execute('INSERT OR IGNORE INTO rows (key) VALUES (?)', (key,))

    def append_note(self, line: str) -> None:
        fd = os.open(self.notes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f'{line}\n'.encode())
        finally:
            os.close(fd)

    def has_note(self, line: str) -> bool:
        return self.notes.exists() and line in self.notes.read_text().splitlines()


def build_agent(store: StepStoreProtocol, run_id: str, world: World) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(model), capabilities=[StepPersistence(store=store, run_id=run_id, capture_frontier=True)]
    )
    trace = world.directory / f'trace-{run_id}'

    def mark(what: str) -> None:
        with trace.open('a') as file:
            file.write(what + '\n')

    def note_written(entry: ToolEffectRecord) -> Reconciled | None:
        # From the arguments: a kill before `annotate_tool_effect` was written leaves no key in the entry.
        args = cast(dict[str, str], entry.args)
        line = f'note::{args["story"]}::{args["text"]}'
        return Reconciled(f'noted {args["text"]}') if world.has_note(line) else None

    @agent.tool
    @recovery_policy('rerun')
    async def add_row(ctx: RunContext[None], story: str, key: str) -> str:  # pyright: ignore[reportUnusedFunction]
        mark('enter')
        idempotency_key = f'row::{story}::{key}'
        await annotate_tool_effect(store, ctx, idempotency_key=idempotency_key, effect_summary=f'row {key}')
        await asyncio.sleep(TOOL_SECONDS)
        world.add_row(idempotency_key)
        await asyncio.sleep(TOOL_SECONDS)
        mark('exit')
        return f'row {key} added'

    @agent.tool
    @recovery_policy(note_written)
    async def append_note(ctx: RunContext[None], story: str, text: str) -> str:  # pyright: ignore[reportUnusedFunction]
        mark('enter')
        line = f'note::{story}::{text}'
        await annotate_tool_effect(store, ctx, idempotency_key=line, effect_summary=f'note {text}')
        await asyncio.sleep(TOOL_SECONDS)
        world.append_note(line)
        await asyncio.sleep(TOOL_SECONDS)
        mark('exit')
        return f'noted {text}'

    return agent


async def attempt(spec: dict[str, Any] | None, job: dict[str, Any], world: World) -> None:
    store = cast(StepStoreProtocol, stepcore.from_spec(**spec)) if spec is not None else InMemoryStepStore()
    try:
        agent = build_agent(store, str(job['run_id']), world)
        resume = job.get('resume')
        if resume is None:
            result = await agent.run(f'story {job["story"]}')
        else:
            try:
                resumption = await resolve_run(store, run_id=str(resume), agent=agent)
            except LookupError:  # killed before its first settled step: no tool ran, start again
                result = await agent.run(f'story {job["story"]}')
            else:
                if resumption.finished:  # killed after its final answer was saved: nothing left to do
                    raise SystemExit(FINISHED)
                result = await resumption.run(agent)
        assert result.output == FINAL, result.output
    finally:
        await cast(Any, store).aclose()


FINISHED = 3
"""The exit status of a resumed attempt whose run had already ended."""


def _child(spec: dict[str, Any], job: dict[str, Any], world: World) -> int:
    delay = job.get('kill_after')
    if delay is not None:
        timer = threading.Timer(float(delay), lambda: os.kill(os.getpid(), signal.SIGKILL))
        timer.daemon = True
        timer.start()
    try:
        asyncio.run(attempt(spec, job, world))
    except SystemExit as done:
        return int(cast(int, done.code))
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str]) -> None:
    spec = cast(dict[str, Any], json.loads(argv[1]))
    world = World(Path(argv[2]))
    world.setup()
    load_factory(get_registry().get('step', str(spec['backend'])).info.factory)
    warm = World(Path(argv[2]) / 'warm-up')
    warm.directory.mkdir(exist_ok=True)
    warm.setup()
    asyncio.run(attempt(None, {'story': 'warm-up', 'run_id': 'warm-up'}, warm))
    serve(lambda job: _child(spec, job, world))


if __name__ == '__main__':
    main(sys.argv)
