"""The workers of the fleet chaos test: `python fleet_worker.py '<config json>'` is their zygote.

The zygote imports stepcore, pydantic-ai and the backend, warms them up (an agent on an in-memory
store, then one read of the shared store, closed before any fork), prints `ready`, then reads one
command per line on stdin: `start` forks a worker and answers its pid at once (the test signals
workers directly: SIGKILL, SIGSTOP, SIGCONT, SIGUSR1, SIGUSR2); `quit` ends the zygote. It reaps its
children as they die, so a dead worker's process id is gone from this host at once.

A worker, on the shared step store and the shared effects database (a SQLite file in the test's world
directory, outside the step store):

- takes queued jobs and starts each with `stepcore.start_job(agent, prompt, job_id=job)`, `runners`
  (from the config) at a time. Some jobs are queued twice (two copies: a request submitted twice),
  and a worker takes at most one copy of a job; the workers that take the two copies start them at the
  same moment, one with `on_conflict='use_existing'` (`wait=0`), the other with `on_conflict='fail'`:
  one of them runs the job, the other is refused (counted as `duplicate start refused`);
- runs `stepcore.run_recovery_loop` (`concurrency` = `resumers`, and `max_recovery_attempts`, from the
  config), resuming every orphan (its own runs included, after a restart) and counting every outcome;
- on SIGUSR2 (PostgreSQL only), opens a connection of its own to the store's database, begins a
  transaction, locks the lease row of a run it owns (`SELECT ... FOR UPDATE`), and SIGSTOPs itself
  inside that transaction; once continued it rolls back and goes on;
- on SIGUSR1, writes what each of its tasks waits on to stderr;
- stops once the test creates the `stop` file and no job of its own is running.

The agent works in `STEPS` tool cycles. Steps 1 and 3 call `apply_effect` (`'rerun'`: the effects
database adds each key once). Step 2 calls `append_effect`, which appends its effect without looking
whether it is there (a re-run would double it), under a reconcile policy that follows the fleet
pattern: take the claimer's `fencing_token()`, raise the effects database's fence for the run's origin
to its epoch first, then look whether the effect is there (`Reconciled`) or not (`None`: it runs again);
every answer is counted. Each tool hands its run's fencing token to the effects database, which refuses
a token lower than the highest it saw for the run's origin. A poison job (`poison-*`) calls
`convert_huge_file` at step 2 instead, which SIGKILLs its own worker every time it runs: recovery
resumes it until `max_recovery_attempts` resumptions died, then sets it `dead`.

Everything a worker sees is counted in the effects database, with the time: refusals (a write of the
store, an effect by token), cancels, reconcile answers, dead runs, warnings stepcore logged, and every
run or recovery attempt that ended with an error nobody expected (`ended by an error`, with its repr).
An error in the seconds after the worker was stopped past its lease is a zombie's (`Stops`), and on
PostgreSQL a recovery attempt reported `busy` met a frozen writer's lock: both are counted apart.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import random
import signal
import socket
import sqlite3
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from pydantic_ai import Agent
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
    JobExistsError,
    OrphanOutcome,
    Reconciled,
    RunClaimedError,
    RunFencedError,
    RunOwnedError,
    StepPersistence,
    StepStore,
    ToolEffectRecord,
    fencing_token,
    recovery_policy,
    run_recovery_loop,
    start_job,
)
from stepcore.ownership import process_alive
from stepcore.store.leases import LeaseState

STEPS = 3
RECONCILED_STEP = 2
"""The step whose tool appends its effect blindly and is settled on recovery by a reconcile function."""
POISON_PREFIX = 'poison-'
"""Jobs named so call the tool that kills its worker, at `RECONCILED_STEP`."""
AGENT_NAME = 'fleet'
BUSY_TIMEOUT = 60.0
TWIN_DELAY = 0.3
"""Seconds from the first copy of a job queued twice being taken to the moment both copies start."""


class ZombieEffect(Exception):
    """An effect refused by the effects database: the run's token is older than one it saw."""


# --- the effects database: outside the step store, counted by the test ------------------------------


class Effects:
    """A SQLite file the tools change and the test reads: effects, jobs, and what was seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.guard = threading.RLock()
        """Held by this process's every use of the file: a worker that freezes itself takes it first, so
        that it never stops while one of its threads holds the file's write lock."""

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection, held under `guard` until it is closed."""
        with self.guard:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
            try:
                db.execute('PRAGMA journal_mode=WAL')
                # no fsync per commit: the file must survive killed processes, not a lost machine, and a
                # worker stopped inside a transaction holds the write lock for less time
                db.execute('PRAGMA synchronous=NORMAL')
                yield db
            finally:
                db.close()

    def setup(self, jobs: list[str]) -> None:
        with self.connect() as db:
            db.executescript(
                """
                CREATE TABLE IF NOT EXISTS jobs (job TEXT NOT NULL, copy INTEGER NOT NULL, state TEXT NOT NULL,
                                                 pid INTEGER, go_at REAL, PRIMARY KEY (job, copy));
                CREATE TABLE IF NOT EXISTS origins (origin TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, origin TEXT NOT NULL, epoch INTEGER NOT NULL,
                                                    run_id TEXT NOT NULL, pid INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS counts (kind TEXT NOT NULL, pid INTEGER NOT NULL, detail TEXT, at REAL);
                CREATE TABLE IF NOT EXISTS pickups (run_id TEXT NOT NULL, owner_pid INTEGER, owner_host TEXT,
                                                    expires REAL NOT NULL, claimed REAL NOT NULL, listed REAL);
                """
            )
        self.add_jobs(jobs)

    def add_jobs(self, jobs: list[str], twins: frozenset[str] = frozenset()) -> None:
        """Queue `jobs`, those in `twins` twice (two copies the workers start at the same moment)."""
        rows = [(job, copy) for job in jobs for copy in range(2 if job in twins else 1)]
        with self.connect() as db:
            db.executemany("INSERT OR IGNORE INTO jobs (job, copy, state) VALUES (?, ?, 'queued')", rows)

    def queued(self) -> int:
        with self.connect() as db:
            return int(db.execute("SELECT count(*) FROM jobs WHERE state = 'queued'").fetchone()[0])

    def count(self, kind: str, detail: str = '') -> None:
        with self.connect() as db:
            db.execute(
                'INSERT INTO counts (kind, pid, detail, at) VALUES (?, ?, ?, ?)',
                (kind, os.getpid(), detail, time.time()),
            )

    def picked_up(self, found: OrphanOutcome) -> None:
        """Note when an orphan was claimed, with its owner, when its lease expired and when the claiming
        worker first listed it."""
        lease, claimed = found.lease, found.claimed_at
        if lease is None or claimed is None:
            return
        owner = lease.owner
        with self.connect() as db:
            db.execute(
                'INSERT INTO pickups VALUES (?, ?, ?, ?, ?, ?)',
                (
                    found.run_id,
                    owner.pid if owner is not None else None,
                    owner.host if owner is not None else None,
                    lease.expires_at.timestamp(),
                    claimed.timestamp(),
                    found.listed_at.timestamp() if found.listed_at is not None else None,
                ),
            )

    def apply(self, key: str, origin: str, epoch: int, run_id: str, *, once: bool = True) -> str:
        """Add the effect `key` under the fencing token `(origin, epoch)`, once per key when `once`, else
        blindly (a second call adds it twice); `ZombieEffect` for an old token."""
        with self.connect() as db:
            db.execute('BEGIN IMMEDIATE')
            row = db.execute('SELECT epoch FROM origins WHERE origin = ?', (origin,)).fetchone()
            if row is not None and epoch < row[0]:
                db.execute(
                    'INSERT INTO counts (kind, pid, detail, at) VALUES (?, ?, ?, ?)',
                    ('zombie effect refused', os.getpid(), f'{key} epoch {epoch} < {row[0]}', time.time()),
                )
                db.execute('COMMIT')
                raise ZombieEffect(f'effect {key} refused: token epoch {epoch} is older than {row[0]}')
            db.execute(
                'INSERT INTO origins (origin, epoch) VALUES (?, ?) ON CONFLICT (origin) DO UPDATE SET epoch = ?',
                (origin, epoch, max(epoch, row[0] if row is not None else 0)),
            )
            done = once and db.execute('SELECT 1 FROM effects WHERE key = ?', (key,)).fetchone() is not None
            if not done:
                db.execute(
                    'INSERT INTO effects (key, origin, epoch, run_id, pid) VALUES (?, ?, ?, ?, ?)',
                    (key, origin, epoch, run_id, os.getpid()),
                )
            db.execute('COMMIT')
            return 'already done' if done else 'done'

    def fence_then_look(self, key: str, origin: str, epoch: int) -> bool:
        """Raise the fence of `origin` to `epoch` (older tokens are refused from now on), then say whether the
        effect `key` is there; the answer is counted (`reconcile found` or `reconcile not found`)."""
        with self.connect() as db:
            db.execute('BEGIN IMMEDIATE')
            db.execute(
                'INSERT INTO origins (origin, epoch) VALUES (?, ?) '
                'ON CONFLICT (origin) DO UPDATE SET epoch = max(epoch, excluded.epoch)',
                (origin, epoch),
            )
            found = db.execute('SELECT 1 FROM effects WHERE key = ?', (key,)).fetchone() is not None
            db.execute(
                'INSERT INTO counts (kind, pid, detail, at) VALUES (?, ?, ?, ?)',
                (
                    'reconcile found' if found else 'reconcile not found',
                    os.getpid(),
                    f'{key} epoch {epoch}',
                    time.time(),
                ),
            )
            db.execute('COMMIT')
            return found

    def take_job(self, store_has_lease: Any) -> tuple[str, int, float | None] | None:
        """A queued copy of a job this worker holds no copy of (poison jobs first), or one taken by a worker
        that died before its run took a lease: `(job, copy, when to start it)` (`None`: at once)."""
        with self.connect() as db:
            db.execute('BEGIN IMMEDIATE')
            mine = {job for (job,) in db.execute('SELECT job FROM jobs WHERE pid = ?', (os.getpid(),))}
            queued = db.execute(
                "SELECT job, copy FROM jobs WHERE state = 'queued' ORDER BY job LIKE ? DESC, rowid LIMIT 50",
                (f'{POISON_PREFIX}%',),
            )
            row = next(((job, copy) for job, copy in queued if job not in mine), None)
            if row is None:
                for job, copy, pid in db.execute("SELECT job, copy, pid FROM jobs WHERE state = 'taken'").fetchall():
                    if _alive(pid) or job in mine:
                        continue
                    if store_has_lease(job):  # its run started: recovery's now, never taken again
                        db.execute("UPDATE jobs SET state = 'in the store' WHERE job = ? AND copy = ?", (job, copy))
                        continue
                    row = (job, copy)
                    break
            go_at: float | None = None
            if row is not None:
                job, copy = row
                take = "UPDATE jobs SET state = 'taken', pid = ? WHERE job = ? AND copy = ?"
                db.execute(take, (os.getpid(), job, copy))
                if db.execute('SELECT count(*) FROM jobs WHERE job = ?', (job,)).fetchone()[0] > 1:
                    first = time.time() + TWIN_DELAY
                    db.execute('UPDATE jobs SET go_at = coalesce(go_at, ?) WHERE job = ?', (first, job))
                    go_at = cast(float, db.execute('SELECT go_at FROM jobs WHERE job = ?', (job,)).fetchone()[0])
            db.execute('COMMIT')
            return None if row is None else (row[0], row[1], go_at)

    def finished(self, job: str, copy: int) -> None:
        with self.connect() as db:
            db.execute("UPDATE jobs SET state = 'finished' WHERE job = ? AND copy = ?", (job, copy))


def _alive(pid: int) -> bool:
    return process_alive(pid)


# --- the agent -----------------------------------------------------------------------------------------


def _returned(messages: list[ModelMessage]) -> int:
    return sum(isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts)


def _job_of(messages: list[ModelMessage]) -> str:
    """The job a run works on, from its first prompt (`run <job>`)."""
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content.removeprefix('run ')
    raise AssertionError(f'no prompt in the history: {messages!r}')


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    step = _returned(messages) + 1
    if step > STEPS:
        return ModelResponse(parts=[TextPart('done')])
    tool = 'apply_effect'
    if step == RECONCILED_STEP:
        tool = 'convert_huge_file' if _job_of(messages).startswith(POISON_PREFIX) else 'append_effect'
    return ModelResponse(parts=[ToolCallPart(tool, {'step': step}, tool_call_id=f'effect-{step}')])


def build_agent(store: StepStore, effects: Effects, *, ttl: float) -> Agent[None, str]:
    agent = Agent(FunctionModel(model), name=AGENT_NAME, capabilities=[StepPersistence(store=store, lease_ttl=ttl)])

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

    async def find_effect(entry: ToolEffectRecord) -> Reconciled | None:
        """Fence, then look: the claimer's token raises the origin's fence before the effect is looked for."""
        args = json.loads(entry.args) if isinstance(entry.args, str) else entry.args
        step = int(cast(dict[str, Any], args)['step'])
        token = fencing_token()  # the claimer's: its epoch is past every epoch the old owner held
        assert token is not None, 'a reconcile function runs under the claim of the run it settles'
        found = await asyncio.to_thread(effects.fence_then_look, f'{token.origin}:{step}', token.origin, token.epoch)
        return Reconciled(f'effect {step} found') if found else None

    @agent.tool_plain
    @recovery_policy(find_effect)
    async def append_effect(step: int) -> str:  # pyright: ignore[reportUnusedFunction]
        await asyncio.sleep(random.uniform(0.01, 0.06))  # long enough for the chaos to land inside it
        token = fencing_token()
        assert token is not None, 'a leased run has a fencing token'
        key = f'{token.origin}:{step}'
        await asyncio.to_thread(effects.apply, key, token.origin, token.epoch, token.run_id, once=False)
        await asyncio.sleep(random.uniform(0.0, 0.04))
        return f'effect {step} appended'

    @agent.tool_plain
    @recovery_policy('rerun')
    async def convert_huge_file(step: int) -> str:  # pyright: ignore[reportUnusedFunction]
        token = fencing_token()
        origin = token.origin if token is not None else '?'
        await asyncio.to_thread(effects.count, 'poison pill', f'{origin} {time.time()!r}')
        os.kill(os.getpid(), signal.SIGKILL)  # out of memory, a crashing native library: the worker dies
        raise AssertionError('unreachable')

    return agent


# --- one worker -------------------------------------------------------------------------------------------


class Stops:
    """Notices when this worker was stopped (SIGSTOP) for longer than its lease: a zombie for a while after.

    A zombie's write in flight when it was stopped may fail with a store error rather than be fenced:
    PostgreSQL ends the connection of a writer frozen in its transaction once its lease expired. Such a
    run was taken over meanwhile; the error is the zombie's, and expected."""

    WINDOW = 5.0
    """Seconds after a thaw during which this worker's errors are a zombie's."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.thawed = -self.WINDOW

    async def watch(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            if now - last > self.ttl:
                self.thawed = now
            last = now

    def zombie(self) -> bool:
        return time.monotonic() - self.thawed < self.WINDOW


async def _start(
    agent: Agent[None, str], effects: Effects, driver: int, stops: Stops, job: str, copy: int, go_at: float | None
) -> None:
    """Start `job` with `start_job`; a copy of a job queued twice waits for the moment both copies start."""
    if go_at is not None:
        await asyncio.sleep(max(go_at - time.time(), 0.0))
        await asyncio.to_thread(effects.count, 'twin start', f'{job} {copy} {time.time()!r}')
    conflict = 'fail' if copy % 2 else 'use_existing'
    try:
        result = await start_job(agent, f'run {job}', job_id=job, on_conflict=conflict, wait=0)
    except JobExistsError as error:
        await asyncio.to_thread(effects.count, 'duplicate start refused', f'{job} fail: {error.status}')
    except RunFencedError as error:
        kind = 'run stopped by a cancel' if _cancelled(error, driver) else 'zombie write refused'
        await asyncio.to_thread(effects.count, kind, str(error)[:200])
    except ZombieEffect as error:
        await asyncio.to_thread(effects.count, 'zombie run stopped by an effect refusal', str(error)[:200])
    except (RunClaimedError, RunOwnedError) as error:
        # its id was taken (a job another worker started and then died, now in recovery's hands)
        await asyncio.to_thread(effects.count, 'job already started', str(error)[:200])
    except Exception as error:
        kind = 'zombie ended by a store error' if stops.zombie() else 'ended by an error'
        await asyncio.to_thread(effects.count, kind, f'start of {job}: {error!r}'[:500])
    else:
        if result.started:
            await asyncio.to_thread(effects.count, 'job started', job)
        else:
            await asyncio.to_thread(effects.count, 'duplicate start refused', f'{job} use_existing: {result.status}')
    await asyncio.to_thread(effects.finished, job, copy)


_EXPECTED = {
    'resumed': 'orphan resumed',
    'taken': 'orphan taken by another worker',
    'finished': 'orphan found finished',
    'abandoned': 'orphan abandoned',  # a resumption killed before it took over the run it resumes
}


def _cancelled(error: RunFencedError, driver: int) -> bool:
    """Whether a write was refused because the run was cancelled: its lease ended so, or the cancel's claim
    (the test's own process, "recovering it") held it at that moment."""
    lease = error.lease
    return lease is not None and (lease.cancelled or (lease.owner is not None and lease.owner.pid == driver))


def _kind(found: OrphanOutcome, origin: str, *, backend: str, driver: int, zombie: bool) -> str:
    """How the test counts one outcome of the recovery loop."""
    detail = found.detail
    if f'pid {driver} (recovering it)' in detail:
        return 'run stopped by a cancel'
    if found.outcome == 'busy' and backend == 'postgres':
        # a writer frozen in its transaction held the run's lock, or this claimer's own connection was ended
        # by the store while it was stopped: tried again at a later tick
        return 'recovery busy'
    if 'cancelled by' in detail:
        return 'run stopped by a cancel'
    if 'RunFencedError' in detail or 'write refused' in detail:
        return 'zombie write refused'
    if 'ZombieEffect' in detail or ('effect' in detail and 'refused' in detail):
        return 'zombie run stopped by an effect refusal'
    if found.outcome == 'dead':
        return 'poison run stopped' if origin.startswith(POISON_PREFIX) else 'ordinary run set dead'
    kind = _EXPECTED.get(found.outcome, 'ended by an error')
    return 'zombie ended by a store error' if kind == 'ended by an error' and zombie else kind


class _Counted(logging.Handler):
    """Counts the warnings stepcore logs (a listing of orphans that failed, a claim not let go), from a
    thread of its own: the event loop never waits for the effects database (a stopped worker may hold it)."""

    def __init__(self, effects: Effects) -> None:
        super().__init__(logging.WARNING)
        self.effects = effects
        self.writer = ThreadPoolExecutor(1, thread_name_prefix='warnings')

    def emit(self, record: logging.LogRecord) -> None:
        self.writer.submit(self.effects.count, 'warning logged', f'{record.name}: {record.getMessage()}'[:500])


def _frozen_in_a_transaction(spec: dict[str, Any], run_id: str, effects: Effects) -> None:
    """Lock the lease row of `run_id` in a transaction of its own, SIGSTOP this process inside it (every
    thread stops), and roll back once continued; under the effects database's guard, so that no thread of
    this worker holds that file's lock meanwhile."""
    import psycopg
    from psycopg import sql

    table = sql.Identifier(f'{spec["table_prefix"]}_run_leases')
    with effects.guard, psycopg.connect(spec['dsn'], connect_timeout=10) as db:
        db.execute("SET lock_timeout = '2s'")
        locked = db.execute(sql.SQL('SELECT run_id FROM {} WHERE run_id = %s FOR UPDATE').format(table), (run_id,))
        if locked.fetchone() is None:
            effects.count('freeze found no run', f'lease row of {run_id} is gone')
            db.rollback()
            return
        effects.count('frozen in a transaction', f'{run_id} {time.time()!r}')
        os.kill(os.getpid(), signal.SIGSTOP)
        db.rollback()
        effects.count('thawed', f'{run_id} {time.time()!r}')


async def worker(config: dict[str, Any]) -> None:
    world = Path(config['world'])
    effects = Effects(world / 'effects.db')
    ttl = float(config['ttl'])
    spec = cast(dict[str, Any], config['spec'])
    driver = int(config['driver'])
    store = cast(StepStore, stepcore.from_spec(**spec))
    stop = world / 'stop'
    agent = build_agent(store, effects, ttl=ttl)
    logging.getLogger('stepcore').addHandler(_Counted(effects))

    async def has_lease(job: str) -> bool:
        return await store.get_lease(job) is not None

    loop = asyncio.get_running_loop()

    def store_has_lease(job: str) -> bool:
        return asyncio.run_coroutine_threadsafe(has_lease(job), loop).result(timeout=BUSY_TIMEOUT)

    async def outcome(found: OrphanOutcome) -> None:
        lease = await store.get_lease(found.run_id)
        origin = (lease.origin if lease is not None else None) or found.run_id
        kind = _kind(found, origin, backend=spec['backend'], driver=driver, zombie=stops.zombie())
        await asyncio.to_thread(effects.count, kind, f'{found.run_id} ({found.outcome}): {found.detail[:400]}')
        await asyncio.to_thread(effects.picked_up, found)

    def dump_tasks() -> None:  # SIGUSR1: what every task of this worker is waiting on, to stderr
        for task in asyncio.all_tasks(loop):
            task.print_stack(limit=12, file=sys.stderr)
        sys.stderr.flush()

    freezes: set[asyncio.Task[None]] = set()

    async def freeze() -> None:  # SIGUSR2: freeze inside a transaction holding the lease row of a run of ours
        try:
            host = socket.gethostname()
            mine = [
                lease.run_id
                for lease in await store.list_leases([LeaseState.RUNNING])
                if lease.owner is not None and lease.owner.pid == os.getpid() and lease.owner.host == host
            ]
            if not mine:
                await asyncio.to_thread(effects.count, 'freeze found no run')
                return
            await asyncio.to_thread(_frozen_in_a_transaction, spec, random.choice(mine), effects)
        except Exception as error:
            await asyncio.to_thread(effects.count, 'freeze failed', repr(error)[:500])

    def on_freeze() -> None:
        task = loop.create_task(freeze())
        freezes.add(task)
        task.add_done_callback(freezes.discard)

    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    if spec['backend'] == 'postgres':
        loop.add_signal_handler(signal.SIGUSR2, on_freeze)
    halt = asyncio.Event()
    stops = Stops(ttl)
    watcher = asyncio.create_task(stops.watch())
    recovery = asyncio.create_task(
        run_recovery_loop(
            store,
            [agent],
            interval=ttl / 2,
            stop=halt,
            on_outcome=outcome,
            lease_ttl=float(config['claim_ttl']),
            concurrency=int(config['resumers']),
            max_recovery_attempts=int(config['max_recovery_attempts']),
        )
    )

    async def runner() -> None:
        while not stop.exists():
            taken = await asyncio.to_thread(effects.take_job, store_has_lease)
            if taken is None:
                await asyncio.sleep(0.05)
                continue
            await _start(agent, effects, driver, stops, *taken)

    runners = [asyncio.create_task(runner()) for _ in range(int(config['runners']))]
    try:
        await asyncio.gather(*runners)
    finally:
        halt.set()
        await recovery
        await asyncio.gather(*freezes, return_exceptions=True)
        watcher.cancel()
        await store.aclose()


def _reap(*_: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> None:
    config = cast(dict[str, Any], json.loads(argv[1]))
    world = Path(config['world'])
    # warm up everything a worker imports and builds, on an in-memory store
    warm = Effects(world / 'warm-up.db')
    warm.setup([])

    async def warm_up() -> None:
        store = InMemoryStepStore()
        agent = build_agent(store, warm, ttl=30.0)
        assert (await start_job(agent, 'run warm-up', job_id='warm-up')).status == 'completed'
        # the backend too: its package, its client library and its schema, so that a fresh worker starts
        # working at once (importing them in each worker took it up to a second on a busy machine)
        shared = cast(StepStore, stepcore.from_spec(**config['spec']))
        try:
            await shared.get_lease('warm-up')
        finally:
            await shared.aclose()  # nothing of it is left open when the workers fork

    asyncio.run(warm_up())
    if config['spec']['backend'] == 'postgres':
        importlib.import_module('psycopg')  # before the workers fork: freezing one must not wait for it
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
                Effects(world / 'effects.db').count('ended by an error', f'worker: {traceback.format_exc()[-800:]}')
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(pid, flush=True)


if __name__ == '__main__':
    main(sys.argv)
