"""One owner and one continuation per run, with real processes on one store (SQLite, and PostgreSQL).

- A second process that tries to resolve, settle or resume a run another process is still executing
  is refused, naming the owner; the run then ends on its own, its effect done once.
- A run killed inside a tool, resolved and resumed to the end, is never resumed again: resolving it
  again says it finished (through its continuation), adds no effect, and the CLI says so; settling
  one of its calls by hand afterwards is refused.
- A person who finds a call did not happen says so per call (`--rerun CALL`), and it runs once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from typer.testing import CliRunner

import stepcore
from stepcore import (
    RunOwnedError,
    StepPersistence,
    StepStore,
    mark_checked,
    recovery_policy,
    resolve_run,
    supply_result,
)
from stepcore.cli import app

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    import stepcore
    from stepcore import StepPersistence, recovery_policy

    job = json.loads(sys.argv[1])
    world = Path(job['world'])

    def model(messages, info):
        returned = {p.tool_call_id for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
        if 'call-2' in returned:
            return ModelResponse(parts=[TextPart('done')])
        if 'call-1' in returned:
            return ModelResponse(parts=[ToolCallPart('notify', {'who': 'team'}, tool_call_id='call-2')])
        return ModelResponse(parts=[ToolCallPart('write_line', {'text': 'one'}, tool_call_id='call-1')])

    async def main():
        store = stepcore.from_spec(**job['spec'])
        agent = Agent(FunctionModel(model), name='writer',
                      capabilities=[StepPersistence(store=store, run_id=job['run_id'], lease_ttl=job['ttl'])])

        @agent.tool_plain
        @recovery_policy('rerun')
        def write_line(text: str) -> str:
            if job['before_effect']:
                (world / 'ready').touch()
                time.sleep(job['work'])
            with (world / 'lines.txt').open('a') as f:
                f.write(text + '\\n')
            if not job['before_effect']:
                (world / 'ready').touch()
                time.sleep(job['work'])
            return 'written'

        @agent.tool_plain
        def notify(who: str) -> str:
            with (world / 'notifications.txt').open('a') as f:
                f.write(who + '\\n')
            return 'notified'

        result = await agent.run('write one line')
        assert result.output == 'done'
        await store.aclose()

    asyncio.run(main())
    """
)


async def _cli(args: list[str]) -> Any:
    """The CLI, on a thread of its own (it runs an event loop of its own)."""
    return await asyncio.to_thread(lambda: CliRunner().invoke(app, args, env={'COLUMNS': '200'}))


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = {p.tool_call_id for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if 'call-2' in returned:
        return ModelResponse(parts=[TextPart('done')])
    if 'call-1' in returned:
        return ModelResponse(parts=[ToolCallPart('notify', {'who': 'team'}, tool_call_id='call-2')])
    return ModelResponse(parts=[ToolCallPart('write_line', {'text': 'one'}, tool_call_id='call-1')])


def _agent(store: StepStore, world: Path) -> Agent[None, str]:
    """The child's agent, in this process: for resuming its run."""
    agent = Agent(FunctionModel(_model), name='writer', capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    @recovery_policy('rerun')
    def write_line(text: str) -> str:  # pyright: ignore[reportUnusedFunction]
        with (world / 'lines.txt').open('a') as f:
            f.write(text + '\n')
        return 'written'

    @agent.tool_plain
    def notify(who: str) -> str:  # pyright: ignore[reportUnusedFunction]
        with (world / 'notifications.txt').open('a') as f:
            f.write(who + '\n')
        return 'notified'

    return agent


@pytest.fixture(params=['sqlite', 'postgres'])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == 'sqlite':
        return {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')}
    url = os.environ.get('STEP_POSTGRES_URL')
    if not url:
        pytest.fail('STEP_POSTGRES_URL is not set: start the test servers (scripts/test.sh does)')
    return {'backend': 'postgres', 'dsn': url}  # the CLI reaches the default table prefix: run ids are unique


def _url(spec: dict[str, Any]) -> str:
    return f'sqlite:///{spec["database"]}' if spec['backend'] == 'sqlite' else spec['dsn']


@pytest.fixture
def ids() -> Any:
    """Run ids unique to this test (the PostgreSQL database is shared by every test)."""
    suffix = uuid.uuid4().hex[:8]
    return lambda name: f'{name}-{suffix}'


def _start(
    spec: dict[str, Any], world: Path, run_id: str, *, ttl: float, work: float, before_effect: bool = False
) -> Any:
    job = {
        'spec': spec,
        'world': str(world),
        'run_id': run_id,
        'ttl': ttl,
        'work': work,
        'before_effect': before_effect,
    }
    child = subprocess.Popen([sys.executable, '-c', CHILD, json.dumps(job)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (world / 'ready').exists():
        assert child.poll() is None, (
            f'the agent process ended early: {child.stderr.read().decode()[-2000:] if child.stderr else ""}'
        )
        assert time.monotonic() < deadline, 'the agent process never reached its tool'
        time.sleep(0.02)
    return child


def _kill(child: Any) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stderr.close()


async def test_a_second_process_cannot_recover_a_run_still_executing(
    spec: dict[str, Any], ids: Any, tmp_path: Path
) -> None:
    run_id = ids('live')
    # The owner works inside its tool for four lease lengths: its lease is renewed meanwhile.
    child = _start(spec, tmp_path, run_id, ttl=1.5, work=6.0)
    try:
        store = stepcore.from_spec(**spec)
        try:
            for _ in range(3):
                with pytest.raises(
                    RunOwnedError, match=rf"run '{run_id}' is running on \S+ pid {child.pid}"
                ) as refused:
                    await resolve_run(store, run_id=run_id, agent=_agent(store, tmp_path))
                assert 'force=True' in str(refused.value)
                with pytest.raises(RunOwnedError, match='supply_result would act on a live run'):
                    await supply_result(store, run_id=run_id, tool_call_id='call-1', result='written')
                with pytest.raises(RunOwnedError, match='mark_checked would act on a live run'):
                    await mark_checked(store, run_id=run_id, tool_call_id='call-1')
                await asyncio.sleep(1.5)
            cli = await _cli(['recover', run_id, '--store', _url(spec), '--supply', 'call-1=written'])
            assert cli.exit_code != 0
            assert 'would act on a live run' in ' '.join(cli.output.split())
            shown = await _cli(['recover', run_id, '--store', _url(spec)])
            assert 'Running now on ' in shown.output
            listed = json.loads((await _cli(['runs', '--store', _url(spec), '--json', '--limit', '1000'])).output)
            assert [r['ownership'] for r in listed if r['run_id'] == run_id] == ['running']
        finally:
            await store.aclose()
        assert child.wait(timeout=60) == 0, child.stderr.read().decode()[-2000:]
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        child.stderr.close()
    assert _lines(tmp_path / 'lines.txt') == ['one']
    assert _lines(tmp_path / 'notifications.txt') == ['team']
    store = stepcore.from_spec(**spec)
    try:
        lease = await store.get_lease(run_id)
        assert lease is not None
        assert (lease.state.value, lease.outcome, lease.epoch) == ('ended', 'completed', 1)
        finished = await resolve_run(store, run_id=run_id)
        assert finished.finished
    finally:
        await store.aclose()


async def test_a_resumed_run_is_never_resumed_again(spec: dict[str, Any], ids: Any, tmp_path: Path) -> None:
    run_id = ids('crashed')
    child = _start(spec, tmp_path, run_id, ttl=30.0, work=600.0)
    _kill(child)  # inside write_line, its line written
    assert _lines(tmp_path / 'lines.txt') == ['one']
    store = stepcore.from_spec(**spec)
    try:
        agent = _agent(store, tmp_path)
        # the owner's process is gone: seen at once on this host, without waiting for the lease
        resumption = await resolve_run(store, run_id=run_id, agent=agent)
        assert resumption.ownership == 'claimed'
        assert [(s.tool_call_id, s.how) for s in resumption.settled] == [('call-1', 'rerun')]
        result = await resumption.run(agent)
        assert result.output == 'done'
        resumed = await store.get_lease(run_id)
        assert resumed is not None
        assert resumed.state.value == 'resumed'
        continuation = resumed.resumed_by
        assert continuation is not None
        assert _lines(tmp_path / 'notifications.txt') == ['team']

        # resolving the crashed run again follows it to its continuation, which finished
        again = await resolve_run(store, run_id=run_id, agent=agent)
        assert again.finished
        assert again.followed == (run_id, continuation)
        with pytest.raises(RuntimeError, match='already ended with a final response'):
            await again.run(agent)
        # settling a call of it by hand is refused: its newest continuation finished
        with pytest.raises(ValueError, match='supply_result refused'):
            await supply_result(store, run_id=run_id, tool_call_id='call-1', result='x')
        with pytest.raises(ValueError, match='mark_checked refused'):
            await mark_checked(store, run_id=run_id, tool_call_id='call-2')
    finally:
        await store.aclose()
    assert _lines(tmp_path / 'lines.txt') == ['one', 'one']  # 'rerun' without dedup: written again on resume, once
    assert _lines(tmp_path / 'notifications.txt') == ['team']

    url = _url(spec)
    shown = ' '.join((await _cli(['recover', run_id, '--store', url])).output.split())
    assert f'Resumed by {continuation} (completed): a resumed run is never resumed again' in shown
    assert 'Next: resumption' not in shown
    supplied = await _cli(['recover', run_id, '--store', url, '--supply', 'call-1=x'])
    assert supplied.exit_code != 0
    assert 'refused' in supplied.output
    listed = {
        r['run_id']: r for r in json.loads((await _cli(['runs', '--store', url, '--json', '--limit', '1000'])).output)
    }
    assert listed[run_id]['standing'] == f'resumed by {continuation} (completed)'
    assert listed[continuation]['status'] == 'completed'


async def test_a_call_that_completed_normally_is_not_settled_by_hand(
    spec: dict[str, Any], ids: Any, tmp_path: Path
) -> None:
    run_id = ids('crashed')
    child = _start(spec, tmp_path, run_id, ttl=30.0, work=600.0)
    _kill(child)
    store = stepcore.from_spec(**spec)
    try:
        with pytest.raises(LookupError, match="no ledger entry for tool call 'call-9'"):
            await supply_result(store, run_id=run_id, tool_call_id='call-9', result='x')
        settled = await supply_result(store, run_id=run_id, tool_call_id='call-1', result='written by hand')
        assert settled.status.value == 'completed'
        with pytest.raises(ValueError, match=r'already settled by hand \(supplied\); pass force=True'):
            await supply_result(store, run_id=run_id, tool_call_id='call-1', result='twice')
        forced = await supply_result(store, run_id=run_id, tool_call_id='call-1', result='again', force=True)
        assert forced.status.value == 'completed'
        agent = _agent(store, tmp_path)
        resumption = await resolve_run(store, run_id=run_id, agent=agent)
        assert [(s.how, s.result) for s in resumption.settled] == [('supplied', 'again')]
        await resumption.run(agent)
        # call-1 of the resumption completed normally: a hand settlement of it is refused
        continuation = (await store.get_lease(run_id)).resumed_by  # pyright: ignore[reportOptionalMemberAccess]
        assert continuation is not None
        with pytest.raises(ValueError, match='refused'):
            await mark_checked(store, run_id=continuation, tool_call_id='call-2')
    finally:
        await store.aclose()
    assert _lines(tmp_path / 'lines.txt') == ['one']  # supplied: not written again


async def test_a_call_found_not_to_have_happened_runs_again_once(
    spec: dict[str, Any], ids: Any, tmp_path: Path
) -> None:
    run_id = ids('crashed')
    # killed inside write_line before it wrote: a person checks, finds no line, and says run it again
    child = _start(spec, tmp_path, run_id, ttl=30.0, work=600.0, before_effect=True)
    _kill(child)
    assert _lines(tmp_path / 'lines.txt') == []
    rerun = await _cli(['recover', run_id, '--store', _url(spec), '--rerun', 'call-1', '--json'])
    assert rerun.exit_code == 0, rerun.output
    store = stepcore.from_spec(**spec)
    try:
        agent = _agent(store, tmp_path)
        resumption = await resolve_run(store, run_id=run_id, agent=agent, policies={'write_line': 'ask'})
        assert [(s.tool_call_id, s.how) for s in resumption.settled] == [('call-1', 'rerun')]
        assert resumption.ready
        await resumption.run(agent)
    finally:
        await store.aclose()
    assert _lines(tmp_path / 'lines.txt') == ['one']
    assert _lines(tmp_path / 'notifications.txt') == ['team']
