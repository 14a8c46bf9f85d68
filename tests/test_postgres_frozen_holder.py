"""A worker frozen inside a PostgreSQL write transaction holds nobody up.

The worker (`frozen_writer.py`) stops itself in the middle of a write's transaction: its session
holds the run's advisory lock and lease row, and its process does nothing. Once its lease has
expired, another process claims and resumes the run at once — its lock waits give up after the
store's lock timeout, and the session of the frozen writer is ended, its lease being gone — while
an unrelated orphan is resumed meanwhile by the same recovery loop. When the frozen worker thaws,
its write is refused: the run completes once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast

import pytest

import stepcore
from stepcore import EventKind, OrphanOutcome, StepStore, run_recovery_loop

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from frozen_writer import build_agent  # noqa: E402  # pyright: ignore[reportMissingImports]


def _writer(spec: dict[str, Any], world: Path, run_id: str, action: str) -> subprocess.Popen[bytes]:
    config = {'spec': spec, 'world': str(world), 'run_id': run_id, 'action': action}
    return subprocess.Popen([sys.executable, str(HERE / 'frozen_writer.py'), json.dumps(config)])


def _stopped(pid: int) -> bool:
    state = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0]
    return state == 'T'


@pytest.fixture
def pg_spec() -> dict[str, Any]:
    url = os.environ.get('STEP_POSTGRES_URL')
    if not url:
        pytest.fail('STEP_POSTGRES_URL is not set: start the test servers (scripts/test.sh does)')
    return {'backend': 'postgres', 'dsn': url, 'table_prefix': f'frozen_{uuid.uuid4().hex[:8]}'}


async def test_a_worker_frozen_inside_a_transaction_holds_up_no_claim(pg_spec: dict[str, Any], tmp_path: Path) -> None:
    store = cast(StepStore, stepcore.from_spec(**pg_spec))
    frozen_run = 'frozen-run'
    worker = _writer(pg_spec, tmp_path, frozen_run, 'stop')
    try:
        # an unrelated orphan: a run whose owner died in the middle of a write
        dead = _writer(pg_spec, tmp_path, 'other-run', 'kill')
        assert dead.wait(60) == -signal.SIGKILL
        deadline = time.monotonic() + 60
        while not ((tmp_path / f'{frozen_run}.frozen').exists() and _stopped(worker.pid)):
            assert worker.poll() is None, 'the worker ended before it froze'
            assert time.monotonic() < deadline, 'the worker never froze inside its write'
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.2)  # both leases expire (1 s)

        outcomes: dict[str, list[tuple[OrphanOutcome, float]]] = {}
        started = time.monotonic()
        stop = asyncio.Event()

        async def seen(outcome: OrphanOutcome) -> None:
            outcomes.setdefault(outcome.run_id, []).append((outcome, time.monotonic() - started))
            if {frozen_run, 'other-run'} <= {r for r, seen in outcomes.items() if seen[-1][0].outcome == 'resumed'}:
                stop.set()

        loop = asyncio.create_task(
            run_recovery_loop(
                store, [build_agent(store, ttl=5.0)], interval=0.3, stop=stop, on_outcome=seen, lease_ttl=5.0
            )
        )
        try:
            await asyncio.wait_for(stop.wait(), 30)
        except TimeoutError:
            pytest.fail(f'not resumed in 30 s: {outcomes}')
        finally:
            stop.set()
            await loop
        assert _stopped(worker.pid), 'the frozen worker was thawed by someone'
        assert outcomes['other-run'][-1][1] < 5.0, outcomes
        assert outcomes[frozen_run][-1][1] < 10.0, outcomes
        # the claim that found the run's lock held said so and let go: no wait, no failure
        assert {o.outcome for o, _ in outcomes[frozen_run][:-1]} <= {'busy'}, outcomes
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
        try:
            worker.wait(30)
        finally:
            if worker.poll() is None:
                worker.kill()

    outcome = (tmp_path / f'{frozen_run}.outcome').read_text()
    assert outcome.startswith('RunFencedError: write refused'), (
        f'the frozen writer, taken over, must stop as fenced (whatever its ended session said): {outcome}'
    )
    lease = await store.get_lease(frozen_run)
    assert lease is not None
    assert lease.resumed_by is not None
    # its history: taken, taken over (maybe let go busy and taken again), handed on, and the refusal
    steps = [change.what.value for change in lease.history]
    assert steps[0] == 'taken'
    assert 'taken over' in steps
    assert 'resumed' in steps
    assert steps.count('refused') == 1, steps
    (refused,) = [change for change in lease.history if change.what.value == 'refused']
    assert (refused.epoch, refused.owner) == (1, f'{socket.gethostname()} pid {worker.pid}')
    events = await store.list_events(lease.resumed_by)
    assert events[-1].kind is EventKind.RUN_COMPLETED
    original = await store.list_events(frozen_run)
    assert not any(event.kind is EventKind.RUN_COMPLETED for event in original), 'the zombie wrote after the takeover'
    await store.aclose()
