"""A fleet under fire: workers sharing one store, SIGKILLed and restarted, paused past their leases.

Four worker processes (`fleet_worker.py`) share one step store (SQLite, PostgreSQL) and run
agent runs (at least `JOBS`: more are queued while the chaos has not landed its blows) whose tools
add effects to a database outside the store, handing it each run's
fencing token. Every worker also runs the recovery loop. A chaos driver meanwhile SIGKILLs a random
worker every few tenths of a second and starts a fresh one, and now and then SIGSTOPs one for longer
than its lease before SIGCONT: a zombie, whose runs other workers take over meanwhile.

It also prints how long orphans waited to be picked up: from the moment a run became an orphan
(its owner killed, or its lease expired) to a worker's claim, p50 and p99.

At the end every run completed exactly once (one completed run per job, across its resumptions),
every effect happened exactly once, no older token's effect was accepted after a newer one (no
run had two owners at once), the zombies' writes were refused by the store and their effects by
token (both counted), and no orphan is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import sqlite3
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, cast

import pytest

import stepcore
from stepcore import EventKind, StepStore, list_orphans
from stepcore.store.leases import LeaseState
from stepcore_conformance.report import SUMMARY_PROPERTY

WORKER = Path(__file__).with_name('fleet_worker.py')
SEED = int(os.environ.get('CHAOS_SEED', '20261206'))
WORKERS = 4
JOBS = 120
STEPS = 3
TTL = 1.0
"""The lease's time to live: short, so that a paused worker's runs are taken over quickly."""
CLAIM_TTL = 3.0
"""How long recovery's claim on an orphan holds until its resumption takes the run over."""
KILL_PAUSE = (0.08, 0.45)
"""Seconds between two blows of the chaos driver."""
PAUSE_SHARE = 0.12
"""Share of the blows that pause a worker rather than kill it."""
PAUSE_LENGTH = (2.0 * TTL, 3.0 * TTL)
MIN_KILLS = 100
MIN_PAUSES = 10
DEADLINE_SECONDS = 240.0


class Fleet:
    """The zygote of the workers, and the workers alive now."""

    def __init__(self, process: asyncio.subprocess.Process, stderr: Path) -> None:
        self.killed_at: dict[int, float] = {}
        """When each killed worker was killed (Unix time)."""
        self.process = process
        self.stderr = stderr
        self.workers: list[int] = []
        self.paused: set[int] = set()

    def failure(self, what: str) -> str:
        tail = self.stderr.read_text(errors='replace')[-4000:] if self.stderr.exists() else ''
        return f'{what}; the workers wrote:\n{tail}'

    async def command(self, line: str) -> str:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(line.encode() + b'\n')
        await self.process.stdin.drain()
        answer = await asyncio.wait_for(self.process.stdout.readline(), 60)
        if not answer:
            pytest.fail(self.failure('the zygote of the workers exited'))
        return answer.decode().strip()

    async def quit(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b'quit\n')
        self.process.stdin.close()
        await asyncio.wait_for(self.process.wait(), 60)

    async def start(self) -> int:
        pid = int(await self.command('start'))
        self.workers.append(pid)
        return pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _progress(store: StepStore, seen: dict[str, str]) -> tuple[set[str], dict[str, list[str]]]:
    """The jobs whose runs completed, and every job's completed runs (by the origin of each run's lease)."""
    completed: dict[str, list[str]] = defaultdict(list)
    for run in await store.list_runs(status='completed'):
        origin = seen.get(run.run_id)
        if origin is None:
            lease = await store.get_lease(run.run_id)
            origin = seen[run.run_id] = (lease.origin if lease is not None else None) or run.run_id
        completed[origin].append(run.run_id)
    return set(completed), completed


def _jobs(count: int) -> set[str]:
    return {f'job-{n:04d}' for n in range(count)}


async def _unleash(fleet: Fleet, store: StepStore, effects: Any, rng: random.Random) -> tuple[Counter[str], set[str]]:
    """Kill and pause workers until enough blows landed, queueing more jobs meanwhile; then let them finish."""
    counts = Counter[str]()
    jobs = _jobs(JOBS)
    seen: dict[str, str] = {}
    resumers: set[asyncio.Task[None]] = set()

    async def pause(pid: int) -> None:
        try:
            await asyncio.sleep(rng.uniform(*PAUSE_LENGTH))
        finally:
            fleet.paused.discard(pid)
            if _alive(pid):
                os.kill(pid, signal.SIGCONT)

    started = time.monotonic()
    next_check = 0.0
    done: set[str] = set()
    while counts['kills'] < MIN_KILLS or counts['pauses'] < MIN_PAUSES:
        await asyncio.sleep(rng.uniform(*KILL_PAUSE))
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 0.5
            if await asyncio.to_thread(effects.queued) < 2 * WORKERS:  # keep them busy while the chaos lasts
                await asyncio.to_thread(effects.add_jobs, len(jobs), 20)
                jobs = _jobs(len(jobs) + 20)
        running = [pid for pid in fleet.workers if pid not in fleet.paused]
        if not running:
            continue
        victim = rng.choice(running)
        if rng.random() < PAUSE_SHARE and len(fleet.paused) < WORKERS - 1:
            os.kill(victim, signal.SIGSTOP)
            fleet.paused.add(victim)
            counts['pauses'] += 1
            task = asyncio.create_task(pause(victim))
            resumers.add(task)
            task.add_done_callback(resumers.discard)
            continue
        os.kill(victim, signal.SIGKILL)
        fleet.killed_at[victim] = time.time()
        fleet.workers.remove(victim)
        counts['kills'] += 1
        await fleet.start()
    done, _ = await _progress(store, seen)
    counts['jobs done under fire'] = len(done)
    counts['seconds of chaos'] = round(time.monotonic() - started)
    await asyncio.gather(*resumers, return_exceptions=True)  # the paused workers go on
    # the calm after: the workers finish every job, resuming what the chaos left
    while not jobs <= done:
        assert time.monotonic() - started < DEADLINE_SECONDS, fleet.failure(
            f'the fleet did not finish in {DEADLINE_SECONDS} s: {dict(counts)}, {len(done)} of {len(jobs)} jobs done'
        )
        await asyncio.sleep(0.5)
        done, _ = await _progress(store, seen)
    counts['seconds in all'] = round(time.monotonic() - started)
    return counts, jobs


def _pickups(world: Path, killed_at: dict[int, float]) -> dict[str, float | int]:
    """Seconds from each orphan's becoming one (its owner killed on this host, or its lease expired) to
    a worker's claim: how many, p50 and p99."""
    host = socket.gethostname()
    with sqlite3.connect(world / 'effects.db') as db:
        rows = db.execute('SELECT owner_pid, owner_host, expires, claimed FROM pickups').fetchall()
    waits: list[float] = []
    for pid, owner_host, expires, claimed in rows:
        orphaned = expires
        if owner_host == host and pid in killed_at:
            orphaned = min(expires, killed_at[pid])
        waits.append(max(claimed - orphaned, 0.0))
    if not waits:
        return {'pickups': 0}
    waits.sort()
    p50 = statistics.median(waits)
    p99 = waits[min(len(waits) - 1, round(0.99 * (len(waits) - 1)))]
    return {'pickups': len(waits), 'pickup p50 (s)': round(p50, 2), 'pickup p99 (s)': round(p99, 2)}


def _effects(world: Path) -> tuple[Counter[str], dict[str, int], list[tuple[str, int]]]:
    with sqlite3.connect(world / 'effects.db') as db:
        keys = Counter(key for (key,) in db.execute('SELECT key FROM effects'))
        counts = Counter(kind for (kind,) in db.execute('SELECT kind FROM counts'))
        ordered = [(origin, epoch) for origin, epoch in db.execute('SELECT origin, epoch FROM effects ORDER BY rowid')]
    return keys, dict(counts), ordered


@pytest.fixture(params=['sqlite', 'postgres'])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == 'sqlite':
        return {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db'), 'timeout': 60.0}
    url = os.environ.get('STEP_POSTGRES_URL')
    if not url:
        pytest.fail('STEP_POSTGRES_URL is not set: start the test servers (scripts/test.sh does)')
    return {'backend': 'postgres', 'dsn': url, 'table_prefix': f'chaos_{uuid.uuid4().hex[:10]}'}


async def test_a_fleet_under_fire_completes_every_run_once_with_every_effect_once(
    spec: dict[str, Any], tmp_path: Path, record_property: Any
) -> None:
    sys.path.insert(0, str(WORKER.parent))
    from fleet_worker import Effects  # pyright: ignore[reportMissingImports]

    effects = Effects(tmp_path / 'effects.db')
    effects.setup(JOBS)
    rng = random.Random(SEED)
    config = {'spec': spec, 'world': str(tmp_path), 'ttl': TTL, 'claim_ttl': CLAIM_TTL}
    stderr = tmp_path / 'workers.stderr'
    with stderr.open('wb') as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            json.dumps(config),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
        )
    fleet = Fleet(process, stderr)
    store = cast(StepStore, stepcore.from_spec(**spec))
    try:
        assert process.stdout is not None
        ready = await asyncio.wait_for(process.stdout.readline(), 120)
        assert ready == b'ready\n', fleet.failure('the workers did not start')
        for _ in range(WORKERS):
            await fleet.start()
        counts, jobs = await _unleash(fleet, store, effects, rng)

        # every worker goes on (the paused ones too) until told to stop, then ends its runs
        for pid in list(fleet.paused):
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        _, completed = await _progress(store, {})
        (tmp_path / 'stop').touch()
        while any(_alive(pid) for pid in fleet.workers):
            if time.monotonic() > deadline:
                for pid in fleet.workers:  # each live worker writes what its tasks wait on
                    if _alive(pid):
                        os.kill(pid, signal.SIGUSR1)
                await asyncio.sleep(2)
                pytest.fail(fleet.failure('the workers did not stop'))
            await asyncio.sleep(0.1)
        await fleet.quit()

        # every job completed exactly once, across its resumptions; nothing is left running or orphaned
        _, completed = await _progress(store, {})
        assert set(completed) == jobs, f'jobs not completed: {sorted(jobs - set(completed))[:10]}'
        twice = {job: runs for job, runs in completed.items() if len(runs) != 1}
        assert not twice, f'jobs completed more than once: {twice}'
        assert await list_orphans(store) == []
        running = await store.list_leases([LeaseState.RUNNING, LeaseState.PENDING])
        assert running == [], f'runs still held: {[lease.describe() for lease in running][:5]}'
        for job, (run_id,) in completed.items():
            events = await store.list_events(run_id)
            assert events[-1].kind is EventKind.RUN_COMPLETED, job
        resumes = sum(1 for run in await store.list_runs() if run.metadata.get('stepcore.resumes'))

        # every effect exactly once; for each origin no older token's effect after a newer one
        keys, refusals, ordered = _effects(tmp_path)
        wanted = {f'{job}:{step}' for job in jobs for step in range(1, STEPS + 1)}
        assert set(keys) == wanted, (
            f'missing {sorted(wanted - set(keys))[:5]}, unexpected {sorted(set(keys) - wanted)[:5]}'
        )
        assert all(n == 1 for n in keys.values()), {k: n for k, n in keys.items() if n != 1}
        newest: dict[str, int] = {}
        for origin, epoch in ordered:
            assert epoch >= newest.get(origin, 0), f'{origin}: an effect of epoch {epoch} after one of {newest[origin]}'
            newest[origin] = epoch
    finally:
        for pid in fleet.workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if process.returncode is None:
            process.kill()
            await process.wait()
        await store.aclose()

    counts.update(
        {
            'runs': len(jobs),
            'effects': len(keys),
            'resumptions': resumes,
            'zombie writes refused': refusals.get('zombie write refused', 0),
            'zombie effects refused': refusals.get('zombie effect refused', 0),
            'orphans resumed': refusals.get('orphan resumed', 0),
            'orphans taken by another worker': refusals.get('orphan taken by another worker', 0),
            **_pickups(tmp_path, fleet.killed_at),
        }
    )
    line = f'fleet under fire ({spec["backend"]}, seed {SEED}, {WORKERS} workers, lease {TTL} s): {dict(counts)}'
    print(line)
    record_property(SUMMARY_PROPERTY, line)
    assert counts['kills'] >= MIN_KILLS, line
    assert counts['pauses'] >= MIN_PAUSES, line
    assert counts['zombie writes refused'] + counts['zombie effects refused'] > 0, f'no zombie was fenced: {line}'
