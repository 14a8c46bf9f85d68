"""A run whose tool kills its worker every time is set dead, not resumed forever (SQLite, PostgreSQL).

The agent's tool SIGKILLs its own process until the test says the cause is fixed. A first process
starts the run and dies in the tool; then one worker process after another runs the recovery loop's
pass (`recover_orphans`, at most 3 resumptions dying), each claiming the orphan, resuming it, and
dying in the tool again, until a worker finds 3 resumptions dead and sets the run `dead` instead. The
tool ran 4 times, no more. `stepcore runs --status dead` lists the run; once the tool is fixed,
`stepcore recover RUN --retry` makes it an orphan again, and the next worker resumes it to the end.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel
from typer.testing import CliRunner

import stepcore
from stepcore import RunClaimedError, StepStore, list_dead, resolve_run
from stepcore.cli import app
from stepcore.store.leases import LeaseState

CHILD = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from pathlib import Path
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    import stepcore
    from stepcore import StepPersistence, recover_orphans, recovery_policy

    job = json.loads(sys.argv[1])
    world = Path(job['world'])

    def model(messages, info):
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart('converted')])
        return ModelResponse(parts=[ToolCallPart('convert', {'file': 'huge.pdf'}, tool_call_id='convert-1')])

    async def main():
        store = stepcore.from_spec(**job['spec'])
        name = job['agent']  # this test's own: the PostgreSQL database is shared with other tests
        agent = Agent(FunctionModel(model), name=name,
                      capabilities=[StepPersistence(store=store, run_id=job.get('run_id'))])
        ours = lambda record: agent if record is not None and record.agent_name == name else None

        @agent.tool_plain
        @recovery_policy('rerun')
        def convert(file: str) -> str:
            with (world / 'runs.txt').open('a') as f:
                f.write(f'{os.getpid()}\\n')
            if not (world / 'fixed').exists():
                os.kill(os.getpid(), signal.SIGKILL)  # out of memory, a native crash: the worker dies
            return f'converted {file}'

        try:
            if job['mode'] == 'start':
                await agent.run('convert the file')
            else:
                outcomes = await recover_orphans(store, ours, max_recovery_attempts=3)
                print(json.dumps([[o.run_id, o.outcome, o.detail] for o in outcomes if o.outcome != 'unknown agent']))
        finally:
            await store.aclose()

    asyncio.run(main())
    """
)


def _child(
    spec: dict[str, Any], world: Path, mode: str, agent: str, run_id: str | None = None
) -> subprocess.CompletedProcess[str]:
    job = {'spec': spec, 'world': str(world), 'mode': mode, 'run_id': run_id, 'agent': agent}
    return subprocess.run(
        [sys.executable, '-c', CHILD, json.dumps(job)], capture_output=True, text=True, timeout=120, check=False
    )


def _tool_runs(world: Path) -> int:
    path = world / 'runs.txt'
    return len(path.read_text().splitlines()) if path.exists() else 0


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={'COLUMNS': '200'})


async def _claimed_again_by_the_loop(spec: dict[str, Any], run_id: str) -> None:
    store = cast(StepStore, stepcore.from_spec(**spec))
    try:
        before = await store.get_lease(run_id)
        assert before is not None
        with pytest.raises(RunClaimedError, match='cannot be resumed automatically: it is dead'):
            await resolve_run(store, run_id=run_id, agent=Agent(TestModel()), max_recovery_attempts=3)
        after = await store.get_lease(run_id)
        assert after is not None
        assert after.state is LeaseState.DEAD
        assert after.died == before.died
        assert run_id in [lease.run_id for lease in await list_dead(store)]
    finally:
        await store.aclose()


def test_a_run_that_kills_its_worker_is_set_dead_then_retried(
    spec: dict[str, Any], store_url: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    run_id, agent = f'poison-{suffix}', f'converter-{suffix}'
    started = _child(spec, tmp_path, 'start', agent, run_id)
    assert started.returncode == -9, started.stderr[-2000:]
    assert _tool_runs(tmp_path) == 1

    reports: list[list[list[str]]] = []
    for _ in range(6):  # each worker dies in the tool, until one finds the run dead
        worker = _child(spec, tmp_path, 'recover', agent)
        if worker.returncode == 0:
            reports.append(json.loads(worker.stdout.strip().splitlines()[-1]))
            break
        assert worker.returncode == -9, worker.stderr[-2000:]
    assert len(reports) == 1, 'no worker found the run dead'
    ((_, outcome, detail),) = reports[0]  # the newest resumption of the run, reported once
    assert outcome == 'dead'
    assert '3 resumptions of it died' in detail
    assert _tool_runs(tmp_path) == 4  # the first run and three resumptions: then no more

    listed = _cli('runs', '-s', store_url, '--status', 'dead', '--json')
    assert listed.exit_code == 0, listed.output
    (dead,) = [r for r in json.loads(listed.output) if r['agent_name'] == agent]
    assert dead['ownership'] == 'dead'
    assert dead['standing'].startswith('dead: 3 resumptions died')

    # a worker that listed the run before another set it dead claims nothing and leaves it dead
    asyncio.run(_claimed_again_by_the_loop(spec, dead['run_id']))

    # the cause is found and fixed: another chance
    (tmp_path / 'fixed').write_text('more memory')
    retried = _cli('recover', run_id, '-s', store_url, '--retry', '--json')
    assert retried.exit_code == 0, retried.output
    worker = _child(spec, tmp_path, 'recover', agent)
    assert worker.returncode == 0, worker.stderr[-2000:]
    outcomes = json.loads(worker.stdout.strip().splitlines()[-1])
    assert [outcome for _, outcome, _ in outcomes] == ['resumed']
    assert _tool_runs(tmp_path) == 5
    gone = _cli('runs', '-s', store_url, '--status', 'dead', '--json')
    assert gone.exit_code == 0, gone.output
    assert [r for r in json.loads(gone.output) if r['run_id'] == dead['run_id']] == []
