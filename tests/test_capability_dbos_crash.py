"""A DBOS workflow killed with SIGKILL mid tool call, then recovered by a new process.

Each side is a real Python process: the first runs the agent workflow until its tool call is in
progress and is killed; the second launches DBOS on the same system database, which recovers the
pending workflow and replays it. The step store is a SQLite file both processes open.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from stepcore import EventKind, SnapshotState, ToolEffectStatus, from_spec
from stepcore_conformance.support import ONE_TOOL_CALL_RUN_EVENTS, kill_when_ready

CHILD = r"""
import asyncio, json, sys
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent, RunContext
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart

from stepcore import StepPersistence, annotate_tool_effect, from_spec
from stepcore_conformance.capability import function_model

config = json.loads(sys.argv[1])
store = from_spec(**config['spec'])


def respond(messages, info):
    if sum(isinstance(m, ModelRequest) for m in messages) == 1:
        return ModelResponse(parts=[ToolCallPart(tool_name='work', args={'n': 1}, tool_call_id='w1')])
    return ModelResponse(parts=[TextPart('recovered')])


capabilities = [StepPersistence(store=store), DBOSDurability()]
agent = Agent(function_model(respond), name='crash_agent', capabilities=capabilities)


@agent.tool
async def work(ctx: RunContext[Any], n: int) -> str:
    await annotate_tool_effect(store, ctx, idempotency_key='work-1', effect_summary='the work')
    with open(config['calls'], 'a') as calls:
        calls.write(config['mode'] + '\n')
    if config['mode'] == 'crash':
        Path(config['ready']).write_text('in tool')
        await asyncio.sleep(3600)
    return 'worked'


@DBOS.workflow(name='stepcore_crash_workflow')
async def run_agent(prompt: str) -> str:
    return (await agent.run(prompt)).output


async def main() -> None:
    DBOS(config={'name': 'stepcorecrash', 'system_database_url': config['dbos']})
    DBOS.launch()
    try:
        if config['mode'] == 'crash':
            with SetWorkflowID('wf-crash'):
                await run_agent('go')
        else:
            handle = await DBOS.retrieve_workflow_async('wf-crash')
            print(json.dumps({'output': await handle.get_result()}))
    finally:
        DBOS.destroy()
        await store.aclose()


asyncio.run(main())
"""


async def _child(script: Path, config: dict[str, Any]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        json.dumps(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_killed_workflow_is_recovered_without_duplicate_writes(tmp_path: Path) -> None:
    script = tmp_path / 'child.py'
    script.write_text(CHILD)
    spec = {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')}
    config: dict[str, Any] = {
        'spec': spec,
        'dbos': f'sqlite:///{tmp_path / "dbos.sqlite"}',
        'ready': str(tmp_path / 'ready'),
        'calls': str(tmp_path / 'calls'),
    }

    crashing = await _child(script, {**config, 'mode': 'crash'})
    await kill_when_ready(
        crashing,
        Path(config['ready']),
        polls=1200,
        failure='the workflow never reached its tool call',
        stderr_tail=3000,
    )

    store = from_spec(**spec)
    try:
        [run] = await store.list_runs()
        assert run.run_id == 'wf-crash:1'
        [unresolved] = await store.list_unresolved_tool_effects(run.run_id)
        assert (unresolved.tool_call_id, unresolved.idempotency_key) == ('w1', 'work-1')
        before = await store.list_events(run.run_id)
        assert before[-1].kind is EventKind.TOOL_CALL_STARTED
    finally:
        await store.aclose()

    recovering = await _child(script, {**config, 'mode': 'recover'})
    out, err = await recovering.communicate()
    assert recovering.returncode == 0, err.decode()[-3000:]
    assert json.loads(out.decode().strip().splitlines()[-1]) == {'output': 'recovered'}
    # The workflow code (and so the tool, which is not a durable step) ran again on recovery.
    assert Path(config['calls']).read_text().split() == ['crash', 'recover']

    store = from_spec(**spec)
    try:
        assert [r.run_id for r in await store.list_runs()] == ['wf-crash:1']
        after = await store.list_events(run.run_id)
        assert after[: len(before)] == before
        assert [e.kind for e in after] == list(ONE_TOOL_CALL_RUN_EVENTS)
        assert len({e.idempotency_key for e in after}) == len(after)
        snapshots = await store.list_snapshots(run.run_id, include_interrupted=True)
        assert [s.state for s in snapshots] == [SnapshotState.COMPLETE, SnapshotState.COMPLETE]
        [effect] = await store.list_tool_effects(run.run_id)
        assert effect.status is ToolEffectStatus.COMPLETED
        assert effect.started_at == unresolved.started_at
        assert effect.idempotency_key == 'work-1'
    finally:
        await store.aclose()
