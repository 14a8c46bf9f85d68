"""The workers of the fleet chaos test: `python fleet_worker.py '<config json>'` is their zygote.

The zygote imports stepcore, pydantic-ai and the backend, warms them up on an in-memory store, prints
`ready`, then reads one command per line on stdin: `start` forks a worker and answers its pid at
once (the test signals workers directly: SIGKILL, SIGSTOP, SIGCONT); `quit` ends the zygote. It
reaps its children as they die, so a killed worker's process id is gone from this host at once.

A worker, on the shared step store and the shared effects database (`effects.py` beside this file's
world directory, a SQLite file outside the step store):

- takes queued jobs and runs each as a fresh run of the agent (run id = the job id), two at a time;
- runs `stepcore.run_recovery_loop`, resuming every orphan (its own runs included, after a restart);
- stops once the test creates the `stop` file and no job of its own is running.

The agent works in `STEPS` tool cycles; its tool `apply_effect` hands the run's fencing token to the
effects database, which refuses a token lower than the highest it saw for the run's origin and
otherwise adds the effect once per key (a re-run of an effect that happened finds it there). Every
refusal the worker sees (a write of the store, an effect by token) is counted in the database.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import sys
import time
import traceback
from pathlib import Path
from typing import Any, cast

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import stepcore
from stepcore import (
    InMemoryStepStore,
    OrphanOutcome,
    RunClaimedError,
    RunFencedError,
    RunOwnedError,
    StepPersistence,
    StepStore,
    fencing_token,
    recovery_policy,
    run_recovery_loop,
)
from stepcore.ownership import process_alive

STEPS = 3
AGENT_NAME = 'fleet'
BUSY_TIMEOUT = 60.0


class ZombieEffect(Exception):
    """An effect refused by the effects database: the run's token is older than one it saw."""


# --- the effects database: outside the step store, counted by the test ------------------------------


class Effects:
    """A SQLite file the tools change and the test reads: effects, jobs, and what was refused."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
        db.execute('PRAGMA journal_mode=WAL')
        return db

    def setup(self, jobs: int) -> None:
        with self.connect() as db:
            db.executescript(
                """
                CREATE TABLE IF NOT EXISTS jobs (job TEXT PRIMARY KEY, state TEXT NOT NULL, pid INTEGER);
                CREATE TABLE IF NOT EXISTS origins (origin TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, origin TEXT NOT NULL, epoch INTEGER NOT NULL,
                                                    run_id TEXT NOT NULL, pid INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS counts (kind TEXT NOT NULL, pid INTEGER NOT NULL, detail TEXT);
                CREATE TABLE IF NOT EXISTS pickups (run_id TEXT NOT NULL, owner_pid INTEGER, owner_host TEXT,
                                                    expires REAL NOT NULL, claimed REAL NOT NULL);
                """
            )
        self.add_jobs(0, jobs)

    def add_jobs(self, first: int, count: int) -> None:
        """Queue jobs `first` to `first + count - 1`."""
        with self.connect() as db:
            db.executemany(
                "INSERT OR IGNORE INTO jobs (job, state) VALUES (?, 'queued')",
                [(f'job-{n:04d}',) for n in range(first, first + count)],
            )

    def queued(self) -> int:
        with self.connect() as db:
            return int(db.execute("SELECT count(*) FROM jobs WHERE state = 'queued'").fetchone()[0])

    def count(self, kind: str, detail: str = '') -> None:
        db = self.connect()
        try:
            db.execute('INSERT INTO counts (kind, pid, detail) VALUES (?, ?, ?)', (kind, os.getpid(), detail))
        finally:
            db.close()

    def picked_up(self, found: OrphanOutcome) -> None:
        """Note when an orphan was claimed, with its owner and when its lease expired."""
        lease, claimed = found.lease, found.claimed_at
        if lease is None or claimed is None:
            return
        owner = lease.owner
        db = self.connect()
        try:
            db.execute(
                'INSERT INTO pickups VALUES (?, ?, ?, ?, ?)',
                (
                    found.run_id,
                    owner.pid if owner is not None else None,
                    owner.host if owner is not None else None,
                    lease.expires_at.timestamp(),
                    claimed.timestamp(),
                ),
            )
        finally:
            db.close()

    def apply(self, key: str, origin: str, epoch: int, run_id: str) -> str:
        """Add the effect `key` once, under the fencing token `(origin, epoch)`; `ZombieEffect` for an old token."""
        db = self.connect()
        try:
            db.execute('BEGIN IMMEDIATE')
            row = db.execute('SELECT epoch FROM origins WHERE origin = ?', (origin,)).fetchone()
            if row is not None and epoch < row[0]:
                db.execute(
                    'INSERT INTO counts (kind, pid, detail) VALUES (?, ?, ?)',
                    ('zombie effect refused', os.getpid(), f'{key} epoch {epoch} < {row[0]}'),
                )
                db.execute('COMMIT')
                raise ZombieEffect(f'effect {key} refused: token epoch {epoch} is older than {row[0]}')
            db.execute(
                'INSERT INTO origins (origin, epoch) VALUES (?, ?) ON CONFLICT (origin) DO UPDATE SET epoch = ?',
                (origin, epoch, max(epoch, row[0] if row is not None else 0)),
            )
            done = db.execute('SELECT 1 FROM effects WHERE key = ?', (key,)).fetchone() is not None
            if not done:
                db.execute(
                    'INSERT INTO effects (key, origin, epoch, run_id, pid) VALUES (?, ?, ?, ?, ?)',
                    (key, origin, epoch, run_id, os.getpid()),
                )
            db.execute('COMMIT')
            return 'already done' if done else 'done'
        finally:
            db.close()

    def take_job(self, store_has_lease: Any) -> str | None:
        """A queued job, or one taken by a worker that died before its run took a lease."""
        db = self.connect()
        try:
            db.execute('BEGIN IMMEDIATE')
            row = db.execute("SELECT job FROM jobs WHERE state = 'queued' LIMIT 1").fetchone()
            if row is None:
                taken = db.execute("SELECT job, pid FROM jobs WHERE state = 'taken'").fetchall()
                row = next(((job,) for job, pid in taken if not _alive(pid) and not store_has_lease(job)), None)
            if row is not None:
                db.execute("UPDATE jobs SET state = 'taken', pid = ? WHERE job = ?", (os.getpid(), row[0]))
            db.execute('COMMIT')
            return None if row is None else cast(str, row[0])
        finally:
            db.close()


def _alive(pid: int) -> bool:
    return process_alive(pid)


# --- the agent -----------------------------------------------------------------------------------------


def _returned(messages: list[ModelMessage]) -> int:
    return sum(isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts)


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    step = _returned(messages) + 1
    if step > STEPS:
        return ModelResponse(parts=[TextPart('done')])
    return ModelResponse(parts=[ToolCallPart('apply_effect', {'step': step}, tool_call_id=f'effect-{step}')])


def build_agent(store: StepStore, effects: Effects, *, ttl: float, run_id: str | None = None) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(model),
        name=AGENT_NAME,
        capabilities=[StepPersistence(store=store, run_id=run_id, lease_ttl=ttl)],
    )

    @agent.tool_plain
    @recovery_policy('rerun')  # re-run safely: the effects database adds each key once
    async def apply_effect(step: int) -> str:  # pyright: ignore[reportUnusedFunction]
        await asyncio.sleep(random.uniform(0.005, 0.03))
        token = fencing_token()
        assert token is not None, 'a leased run has a fencing token'
        key = f'{token.origin}:{step}'
        outcome = await asyncio.to_thread(effects.apply, key, token.origin, token.epoch, token.run_id)
        await asyncio.sleep(random.uniform(0.0, 0.02))
        return f'effect {step} {outcome}'

    return agent


# --- one worker -------------------------------------------------------------------------------------------


async def _run_job(store: StepStore, effects: Effects, job: str, ttl: float) -> None:
    agent = build_agent(store, effects, ttl=ttl, run_id=job)
    try:
        result = await agent.run(f'run {job}')
        assert result.output == 'done', result.output
    except RunFencedError as error:
        await asyncio.to_thread(effects.count, 'zombie write refused', str(error)[:200])
    except ZombieEffect as error:
        await asyncio.to_thread(effects.count, 'zombie run stopped by an effect refusal', str(error)[:200])
    except (RunClaimedError, RunOwnedError, ValueError) as error:
        # its id was taken (a job another worker started and then died, now in recovery's hands)
        await asyncio.to_thread(effects.count, 'job already started', str(error)[:200])


async def worker(config: dict[str, Any]) -> None:
    world = Path(config['world'])
    effects = Effects(world / 'effects.db')
    ttl = float(config['ttl'])
    store = cast(StepStore, stepcore.from_spec(**config['spec']))
    stop = world / 'stop'
    recovery_agent = build_agent(store, effects, ttl=ttl)

    async def has_lease(job: str) -> bool:
        return await store.get_lease(job) is not None

    loop = asyncio.get_running_loop()

    def store_has_lease(job: str) -> bool:
        return asyncio.run_coroutine_threadsafe(has_lease(job), loop).result(timeout=BUSY_TIMEOUT)

    async def outcome(found: OrphanOutcome) -> None:
        kind = {'resumed': 'orphan resumed', 'taken': 'orphan taken by another worker'}.get(found.outcome)
        if kind is None:
            kind = f'orphan {found.outcome}'
        if 'RunFencedError' in found.detail or 'write refused' in found.detail:
            kind = 'zombie write refused'
        elif 'ZombieEffect' in found.detail or ('effect' in found.detail and 'refused' in found.detail):
            kind = 'zombie run stopped by an effect refusal'
        await asyncio.to_thread(effects.count, kind, f'{found.run_id}: {found.detail[:200]}')
        await asyncio.to_thread(effects.picked_up, found)

    def dump_tasks() -> None:  # SIGUSR1: what every task of this worker is waiting on, to stderr
        for task in asyncio.all_tasks(loop):
            task.print_stack(limit=12, file=sys.stderr)
        sys.stderr.flush()

    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    halt = asyncio.Event()
    recovery = asyncio.create_task(
        run_recovery_loop(
            store,
            [recovery_agent],
            interval=ttl / 2,
            stop=halt,
            on_outcome=outcome,
            lease_ttl=float(config['claim_ttl']),
            concurrency=2,
            # the chaos kills resumptions at random, often: no run is given up on for dying
            max_recovery_attempts=None,
        )
    )

    async def runner() -> None:
        while not stop.exists():
            job = await asyncio.to_thread(effects.take_job, store_has_lease)
            if job is None:
                await asyncio.sleep(0.05)
                continue
            await _run_job(store, effects, job, ttl)

    runners = [asyncio.create_task(runner()) for _ in range(2)]
    try:
        await asyncio.gather(*runners)
    finally:
        halt.set()
        await recovery
        await store.aclose()


def _reap(*_: object) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> None:
    config = cast(dict[str, Any], json.loads(argv[1]))
    # warm up everything a worker imports and builds, on an in-memory store
    warm = Effects(Path(config['world']) / 'warm-up.db')
    warm.setup(1)

    async def warm_up() -> None:
        store = InMemoryStepStore()
        agent = build_agent(store, warm, ttl=30.0, run_id='warm-up')
        assert (await agent.run('warm up')).output == 'done'

    asyncio.run(warm_up())
    signal.signal(signal.SIGCHLD, _reap)
    print('ready', flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == 'quit':
            break
        if command != 'start':
            continue
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 0
            try:
                random.seed(os.getpid() ^ time.monotonic_ns())
                asyncio.run(worker(config))
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(pid, flush=True)


if __name__ == '__main__':
    main(sys.argv)
