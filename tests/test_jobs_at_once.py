"""Two processes start the same job at the same moment: it runs once (SQLite and PostgreSQL).

Each process waits for the test's word, then submits the job with `start_job`; one of them runs it,
the other waits for it and learns how it ended. The job's tool appends a line to a file outside the
store: one line. `stepcore job ID` then shows the job's one run, completed, and `stepcore runs --job`
lists it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from stepcore.cli import app

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    import stepcore
    from stepcore import StepPersistence, start_job

    job = json.loads(sys.argv[1])
    world = Path(job['world'])

    def model(messages, info):
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart('charged')])
        return ModelResponse(parts=[ToolCallPart('charge', {'cents': 500}, tool_call_id='charge-1')])

    async def main():
        store = stepcore.from_spec(**job['spec'])
        agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store)])

        @agent.tool_plain
        async def charge(cents: int) -> str:
            await asyncio.sleep(0.3)
            with (world / 'charges.txt').open('a') as f:
                f.write(f'{cents}\\n')
            return 'charged'

        try:
            await store.list_runs(limit=1)  # connected before the race
            (world / f'ready-{job["n"]}').write_text('ready')
            while not (world / 'go').exists():
                await asyncio.sleep(0.002)
            result = await start_job(agent, 'charge the customer', job_id=job['job_id'], poll=0.05)
            print(json.dumps({'started': result.started, 'status': result.status, 'run_id': result.run_id}))
        finally:
            await store.aclose()

    asyncio.run(main())
    """
)


def test_two_processes_starting_one_job_at_once_run_it_once(
    spec: dict[str, Any], store_url: str, tmp_path: Path
) -> None:
    job_id = f'charge-{uuid.uuid4().hex[:8]}'
    children = [
        subprocess.Popen(
            [sys.executable, '-c', CHILD, json.dumps({'spec': spec, 'world': str(tmp_path), 'job_id': job_id, 'n': n})],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f'ready-{n}').exists() for n in range(2)):
            assert all(c.poll() is None for c in children), [c.stderr.read() for c in children if c.stderr]
            assert time.monotonic() < deadline, 'the processes never got ready'
            time.sleep(0.01)
        (tmp_path / 'go').write_text('go')
        outputs = [c.communicate(timeout=120) for c in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate()
    assert [c.returncode for c in children] == [0, 0], [err[-2000:] for _, err in outputs]
    answers = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sorted(a['started'] for a in answers) == [False, True]
    assert [(a['status'], a['run_id']) for a in answers] == [('completed', job_id)] * 2
    assert (tmp_path / 'charges.txt').read_text().splitlines() == ['500']  # charged once

    shown = CliRunner().invoke(app, ['job', job_id, '-s', store_url, '--json'], env={'COLUMNS': '200'})
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert (data['job_id'], data['status']) == (job_id, 'completed')
    assert [(r['run_id'], r['status'], r['lease']['job']) for r in data['runs']] == [(job_id, 'completed', job_id)]
    table = CliRunner().invoke(app, ['job', job_id, '-s', store_url], env={'COLUMNS': '200'})
    assert table.exit_code == 0, table.output
    assert f'job {job_id} is completed' in table.output
    listed = CliRunner().invoke(app, ['runs', '-s', store_url, '--job', job_id, '--json'], env={'COLUMNS': '200'})
    assert listed.exit_code == 0, listed.output
    assert [r['run_id'] for r in json.loads(listed.output)] == [job_id]
    unknown = CliRunner().invoke(app, ['job', 'no-such-job', '-s', store_url], env={'COLUMNS': '200'})
    assert unknown.exit_code == 1
    assert "no job 'no-such-job'" in unknown.output
