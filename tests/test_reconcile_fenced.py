"""A reconcile function acts under the claimer's fencing token, so a zombie cannot double an effect.

Process A runs the shipping agent (`zombie_shipper.py`) and is frozen (SIGSTOP) inside its tool,
before it writes the order. Its lease expires; this process (B) claims the run and reconciles the
call with the tool's policy: raise the order system's fence with `fencing_token()`, then look. The
order is not there, so the call is to run again. Right then, between B's look and B's re-run, A is
thawed and tries its write: the order system refuses it (its epoch is older than the claimer's). B's
resumption then ships once. The order system is a SQLite file outside the step store; the test
counts its rows. On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import stepcore
from stepcore import Reconciled, RunOwnedError, ToolEffectRecord, fencing_token, resolve_run
from stepcore.store.leases import LeaseState

SHIPPER = Path(__file__).with_name('zombie_shipper.py')
TTL = 1.0


def _shipper() -> ModuleType:
    spec = importlib.util.spec_from_file_location('zombie_shipper', SHIPPER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start(config: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(SHIPPER), json.dumps(config)], stderr=subprocess.PIPE)


async def _wait_for(path_glob: str, world: Path, child: subprocess.Popen[bytes], what: str) -> Path:
    deadline = time.monotonic() + 60
    while not (found := sorted(world.glob(path_glob))):
        if child.poll() is not None:
            stderr = child.stderr.read().decode()[-3000:] if child.stderr else ''
            pytest.fail(f'the shipping process ended before {what}: {stderr}')
        assert time.monotonic() < deadline, f'the shipping process never got to {what}'
        await asyncio.sleep(0.01)
    return found[0]


async def test_a_zombie_thawed_after_the_claimers_look_is_refused_and_the_order_ships_once(
    spec: dict[str, Any], tmp_path: Path
) -> None:
    shipper = _shipper()
    run_id = f'order-{uuid.uuid4().hex[:8]}'
    config = {'spec': spec, 'world': str(tmp_path), 'run_id': run_id, 'ttl': TTL}
    zombie = _start(config)
    try:
        ready = await _wait_for(f'ready-{zombie.pid}', tmp_path, zombie, 'its tool')
        os.kill(zombie.pid, signal.SIGSTOP)  # frozen inside `ship`, before its write
        zombie_epoch = int(ready.read_text())

        store = stepcore.from_spec(**spec)
        try:
            agent = shipper.build_agent(store, tmp_path, ttl=TTL)
            looked: list[int] = []

            async def find_then_thaw(entry: ToolEffectRecord) -> Reconciled | None:
                """The tool's own policy; then, in the window before the re-run, the zombie goes on."""
                token = fencing_token()
                assert token is not None
                looked.append(token.epoch)
                found = policy(entry)
                (tmp_path / 'thawed').write_text('go')
                os.kill(zombie.pid, signal.SIGCONT)
                await _wait_for(f'attempted-{zombie.pid}', tmp_path, zombie, 'its write')
                return found

            policy = shipper.find_order_in(shipper.Orders(tmp_path / 'orders.db'))
            deadline = time.monotonic() + 30
            while True:  # the lease expires TTL after the freeze: until then the run is live
                try:
                    resumption = await resolve_run(store, run_id=run_id, agent=agent, policies={'ship': find_then_thaw})
                    break
                except RunOwnedError:
                    assert time.monotonic() < deadline, "the frozen owner's lease never expired"
                    await asyncio.sleep(0.1)
            assert [(s.tool_call_id, s.how) for s in resumption.settled] == [('ship-1', 'rerun')]
            assert len(looked) == 1
            assert looked[0] > zombie_epoch  # the claimer looked under an epoch past the zombie's
            result = await resumption.run(agent)
            assert result.output == 'shipped'
            lease = await store.get_lease(run_id)
            assert lease is not None
            assert lease.state is LeaseState.RESUMED
        finally:
            await store.aclose()

        assert zombie.wait(timeout=60) != 0  # its write refused downstream, its run fenced in the store
        attempt = (tmp_path / f'attempted-{zombie.pid}').read_text()
        assert attempt.startswith('refused'), attempt
    finally:
        if zombie.poll() is None:
            os.kill(zombie.pid, signal.SIGKILL)
            zombie.wait()
        if zombie.stderr is not None:
            zombie.stderr.close()

    orders = shipper.Orders(tmp_path / 'orders.db')
    rows = orders.rows()
    assert len(rows) == 1, rows  # once: by the resumption, not by the zombie as well
    (_, _, epoch, pid) = rows[0]
    assert pid == os.getpid()
    assert epoch > looked[0]
    assert [(r[1], r[2]) for r in orders.refusals()] == [(zombie_epoch, looked[0])]
