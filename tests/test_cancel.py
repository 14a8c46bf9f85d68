"""`stepcore cancel` stops a run running in another process, for good (SQLite and PostgreSQL).

The child runs an agent whose tool waits for the test's word, then asks the store whether the run is
still its own (`check_fencing_token`) before it acts. The test cancels the run from the command line
meanwhile: the tool is refused, the child's run ends with the store refusing its writes, nothing is
acted on, and recovery refuses the run afterwards.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import stepcore
from stepcore import RunCancelledError, resolve_run
from stepcore.cli import app
from stepcore.store.leases import LeaseState

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    import stepcore
    from stepcore import StepPersistence, check_fencing_token

    job = json.loads(sys.argv[1])
    world = Path(job['world'])

    def model(messages, info):
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart('done')])
        return ModelResponse(parts=[ToolCallPart('act', {}, tool_call_id='act-1')])

    async def main():
        store = stepcore.from_spec(**job['spec'])
        agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, run_id=job['run_id'])])

        @agent.tool_plain
        async def act() -> str:
            (world / 'ready').write_text('in the tool')
            while not (world / 'go').exists():
                await asyncio.sleep(0.01)
            await check_fencing_token()
            (world / 'acted').write_text('acted')
            return 'acted'

        try:
            await agent.run('act once')
        finally:
            await store.aclose()

    asyncio.run(main())
    """
)


def _start(spec: dict[str, Any], world: Path, run_id: str) -> subprocess.Popen[bytes]:
    job = {'spec': spec, 'world': str(world), 'run_id': run_id}
    child = subprocess.Popen([sys.executable, '-c', CHILD, json.dumps(job)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (world / 'ready').exists():
        if child.poll() is not None:
            pytest.fail(
                f'the agent process ended early: {child.stderr.read().decode()[-2000:] if child.stderr else ""}'
            )
        assert time.monotonic() < deadline, 'the agent process never reached its tool'
        time.sleep(0.02)
    return child


def _cancel(url: str, run_id: str, *extra: str) -> Any:
    args = ['cancel', run_id, '-s', url, '--reason', 'wrong customer', '--by', 'alice', *extra]
    return CliRunner().invoke(app, args, env={'COLUMNS': '200'})


async def test_cancel_stops_a_run_in_another_process_before_its_tool_acts(
    spec: dict[str, Any], store_url: str, tmp_path: Path
) -> None:
    run_id = f'cancel-{uuid.uuid4().hex[:8]}'
    child = _start(spec, tmp_path, run_id)
    try:
        done = await asyncio.to_thread(_cancel, store_url, run_id)
        assert done.exit_code == 0, done.output
        assert f'run {run_id} is cancelled by alice: wrong customer' in done.output
        (tmp_path / 'go').write_text('go')
        assert child.wait(timeout=60) != 0
        stderr = child.stderr.read().decode() if child.stderr else ''
        assert 'RunFencedError' in stderr
        assert 'cancelled by alice: wrong customer' in stderr
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stderr is not None:
            child.stderr.close()
    assert not (tmp_path / 'acted').exists()

    again = await asyncio.to_thread(_cancel, store_url, run_id, '--json')
    assert again.exit_code == 0, again.output
    assert json.loads(again.output) == {
        'run_id': run_id,
        'state': 'ended',
        'outcome': 'cancelled',
        'note': 'cancelled by alice: wrong customer',
    }
    store = stepcore.from_spec(**spec)
    try:
        lease = await store.get_lease(run_id)
        assert lease is not None
        assert lease.state is LeaseState.ENDED
        with pytest.raises(RunCancelledError, match='wrong customer'):
            await resolve_run(store, run_id=run_id, force=True)
    finally:
        await store.aclose()


def test_cancelling_a_finished_run_is_refused_with_what_it_ended_as(tmp_path: Path) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    spec = {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')}

    async def finish() -> None:
        store = stepcore.from_spec(**spec)
        try:
            await Agent(TestModel(), capabilities=[stepcore.StepPersistence(store=store, run_id='finished')]).run('hi')
        finally:
            await store.aclose()

    asyncio.run(finish())
    refused = _cancel(f'sqlite:///{spec["database"]}', 'finished')
    assert refused.exit_code == 1
    assert 'already ended (completed)' in refused.output
