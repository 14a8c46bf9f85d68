"""Durable approvals with real processes on one store (SQLite, the file store, PostgreSQL).

A run pauses on a tool that needs approval and its process exits; another process (`stepcore answer`)
records the approval, with other arguments; a third resumes it, and the tool runs once, with them.
Beside it: a denial reaches the model, two resumers at once let exactly one through, a process
killed inside the approved call leaves it to its tool's recovery policy, answers are recorded once,
and a deadline denies a call nobody answered. Effects are counted in a file outside the processes.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pydantic_ai import Agent, CallDeferred
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

import stepcore
from stepcore import (
    AnswerConflictError,
    RequestExpiredError,
    RunClaimedError,
    RunOwnedError,
    StepPersistence,
    StepStore,
    answer_call,
    approve_call,
    continue_run,
    deny_call,
    fail_call,
    inspect_recovery,
    list_orphans,
    list_waiting,
    read_waiting,
    resolve_run,
    resume_run,
    supply_result,
)

TESTS = Path(__file__).resolve().parent
T = TypeVar('T')
_spec = importlib.util.spec_from_file_location('approval_app', TESTS / 'approval_app.py')
assert _spec is not None
assert _spec.loader is not None
_app = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_app)
build = _app.build

RESUMER = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    import approval_app
    from stepcore import resume_run

    async def main():
        go = Path(sys.argv[2])
        while not go.exists():
            await asyncio.sleep(0.005)
        try:
            result = await resume_run(approval_app.store, run_id=sys.argv[1], agent=approval_app.agent)
            print(json.dumps({'resumed_as': result.run_id, 'output': result.output}))
        except Exception as error:
            print(json.dumps({'refused': type(error).__name__, 'why': str(error)}))
        finally:
            await approval_app.store.aclose()

    asyncio.run(main())
    """
)


@pytest.fixture(params=['sqlite', 'file', 'postgres'])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == 'sqlite':
        return {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')}
    if request.param == 'file':
        return {'backend': 'file', 'directory': str(tmp_path / 'runs')}
    url = os.environ.get('STEP_POSTGRES_URL')
    if not url:
        pytest.fail('STEP_POSTGRES_URL is not set: start the test servers (scripts/test.sh does)')
    # a table prefix of this test's own: the database is shared by every test
    return {'backend': 'postgres', 'dsn': url, 'table_prefix': f'appr_{uuid.uuid4().hex[:10]}'}


def _url(spec: dict[str, Any]) -> str:
    if spec['backend'] == 'sqlite':
        return f'sqlite:///{spec["database"]}'
    if spec['backend'] == 'file':
        return f'file://{spec["directory"]}'
    return f'{spec["dsn"]}{"&" if "?" in spec["dsn"] else "?"}table_prefix={spec["table_prefix"]}'


@pytest.fixture
def world(tmp_path: Path) -> Path:
    folder = tmp_path / 'world'
    folder.mkdir()
    return folder


def _env(spec: dict[str, Any], world: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(TESTS), os.environ.get('PYTHONPATH', '')])
    return {
        **os.environ,
        'PYTHONPATH': path,
        'APPROVAL_SPEC': json.dumps(spec),
        'APPROVAL_WORLD': str(world),
        'COLUMNS': '200',
        **extra,
    }


def _effects(world: Path) -> list[str]:
    path = world / 'effects.txt'
    return path.read_text().splitlines() if path.exists() else []


def _pause(spec: dict[str, Any], world: Path, **extra: str) -> str:
    """Process A: start a run that pauses on `drop_table`, and exit. Answers its run id."""
    done = subprocess.run(
        [sys.executable, str(TESTS / 'approval_app.py'), 'drop the users table'],
        env=_env(spec, world, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _stepcore(spec: dict[str, Any], world: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The `stepcore` command in a process of its own, on the test's store."""
    return subprocess.run(
        [sys.executable, '-m', 'stepcore.cli', *args, '--store', _url(spec)],
        env=_env(spec, world),
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _on_store(spec: dict[str, Any], body: Callable[[StepStore], Awaitable[T]]) -> T:
    """`body` on a store of its own over the test's data, in this process."""

    async def main() -> T:
        store = stepcore.from_spec(**spec)
        try:
            return await body(store)
        finally:
            await store.aclose()

    return asyncio.run(main())


def _kill_inside_the_drop(spec: dict[str, Any], world: Path, run_id: str) -> None:
    """Process C resumes the run and is SIGKILLed inside the approved `drop_table`, after its effect."""
    command = [sys.executable, '-m', 'stepcore.cli', 'resume', run_id, '--agent', 'approval_app:agent']
    child = subprocess.Popen(
        [*command, '--store', _url(spec)],
        env=_env(spec, world, APPROVAL_HOLD='30'),
        cwd=TESTS,
        stderr=subprocess.PIPE,
    )
    assert child.stderr is not None
    deadline = time.monotonic() + 60
    while not (world / 'dropping').exists():
        assert child.poll() is None, child.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, 'the resumer never reached the approved call'
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stderr.close()


def test_approved_in_one_process_with_other_args_resumed_in_another_runs_once(
    spec: dict[str, Any], world: Path
) -> None:
    run_id = _pause(spec, world)
    assert _effects(world) == ['count users']  # the call beside the deferred one ran; the drop waits

    async def stored_as_waiting(store: StepStore) -> None:
        # never completed, never an orphan, listed among the waiting runs
        [waiting] = await list_waiting(store)
        assert waiting.run_id == run_id
        [call] = waiting.calls
        assert (call.tool_call_id, call.tool_name, call.args, call.kind) == (
            'call-drop',
            'drop_table',
            {'name': 'users'},
            'approval',
        )
        assert [r.run_id for r in await store.list_runs(status='waiting')] == [run_id]
        assert await store.list_runs(status='completed') == []
        assert await list_orphans(store) == []
        report = await inspect_recovery(store=store, run_id=run_id)
        assert report.unresolved == ()  # count_rows is completed with the paused history
        assert report.completed_tools == ('count_rows',)

    _on_store(spec, stored_as_waiting)
    listed = _stepcore(spec, world, 'runs', '--status', 'waiting')
    assert listed.returncode == 0, listed.stderr
    assert run_id in listed.stdout
    assert 'waiting for answers' in listed.stdout
    told = _stepcore(spec, world, 'recover', run_id)
    assert 'Paused on deferred tool calls' in told.stdout
    assert 'drop_table (call-drop) needs approval, args {"name": "users"}: waiting for an answer' in told.stdout

    # process B: a person approves, with other arguments
    approved = _stepcore(
        spec, world, 'answer', run_id, 'call-drop', '--approve', '--args', '{"name": "guests"}', '--by', 'alice'
    )
    assert approved.returncode == 0, approved.stderr
    assert 'call-drop: approved by alice at ' in approved.stdout
    assert 'to run with {"name": "guests"} instead' in approved.stdout  # JSON, as --args takes it
    told = _stepcore(spec, world, 'recover', run_id, '--json')
    [call_json] = json.loads(told.stdout)['waiting']['calls']
    assert call_json['answer']['decision'] == 'approved'
    assert call_json['answer']['by'] == 'alice'

    # process C: resumes it; the tool runs once, with the approved arguments
    resumed = _stepcore(spec, world, 'resume', run_id, '--agent', 'approval_app:agent')
    assert resumed.returncode == 0, resumed.stderr
    assert 'drop_table said: dropped guests' in resumed.stdout
    assert _effects(world) == ['count users', 'drop guests']

    # resumed once: again resumes nothing (its continuation finished: status 0, saying so); a late answer is refused
    again = _stepcore(spec, world, 'resume', run_id, '--agent', 'approval_app:agent')
    assert again.returncode == 0, again.stderr
    assert 'already ended with a final response: there is nothing to resume' in ' '.join(again.stdout.split())
    late = _stepcore(spec, world, 'answer', run_id, 'call-drop', '--deny', '--by', 'bob')
    assert late.returncode == 1
    assert 'was resumed by run' in late.stderr
    assert _effects(world) == ['count users', 'drop guests']
    assert _on_store(spec, list_waiting) == []


def test_two_resumers_at_once_one_proceeds(spec: dict[str, Any], world: Path) -> None:
    run_id = _pause(spec, world)

    async def approve(store: StepStore) -> None:
        await approve_call(store, run_id=run_id, tool_call_id='call-drop', by='alice')

    _on_store(spec, approve)
    go = world / 'go'
    env = _env(spec, world, APPROVAL_HOLD='1.0')  # the winner holds the run while the other tries
    resumers = [
        subprocess.Popen(
            [sys.executable, '-c', RESUMER, run_id, str(go)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    time.sleep(1.5)  # both imported and waiting for the word
    go.touch()
    outcomes: list[dict[str, Any]] = []
    for resumer in resumers:
        out, err = resumer.communicate(timeout=120)
        assert resumer.returncode == 0, err.decode()[-3000:]
        outcomes.append(json.loads(out.decode().strip().splitlines()[-1]))
    winners = [o for o in outcomes if 'resumed_as' in o]
    losers = [o for o in outcomes if 'refused' in o]
    assert len(winners) == 1, outcomes
    assert len(losers) == 1, outcomes
    assert winners[0]['output'] == 'drop_table said: dropped users'
    assert losers[0]['refused'] in (RunOwnedError.__name__, RunClaimedError.__name__), losers
    assert _effects(world) == ['count users', 'drop users']


def test_killed_inside_the_approved_call_is_settled_by_its_policy(spec: dict[str, Any], world: Path) -> None:
    run_id = _pause(spec, world)

    async def approve(store: StepStore) -> None:
        await approve_call(store, run_id=run_id, tool_call_id='call-drop', override_args={'name': 'guests'})

    _on_store(spec, approve)
    _kill_inside_the_drop(spec, world, run_id)
    assert _effects(world) == ['count users', 'drop guests']
    time.sleep(2.5)  # the killed resumer's lease (2 s) runs out

    async def recover(store: StepStore) -> None:
        agent = build(store, world)
        # the default policy ('ask') leaves the cut-short approved call to a person
        first = await resolve_run(store, run_id=run_id, agent=agent)
        assert [e.tool_name for e in first.pending] == ['drop_table']
        assert first.pending[0].args == {'name': 'guests'}  # what it ran with
        assert first.run_id != run_id  # the resumption that was killed
        # policy 'rerun': it runs again, with the approved arguments, and the run finishes
        result = await resume_run(store, run_id=run_id, agent=agent, policies={'drop_table': 'rerun'})
        assert result.output == 'drop_table said: dropped guests'

    _on_store(spec, recover)
    assert _effects(world) == ['count users', 'drop guests', 'drop guests']


def test_a_person_settles_the_cut_short_approved_call(spec: dict[str, Any], world: Path) -> None:
    run_id = _pause(spec, world)

    async def approve(store: StepStore) -> None:
        await approve_call(store, run_id=run_id, tool_call_id='call-drop')
        with pytest.raises(ValueError, match='deferred call that waits for an answer'):
            await supply_result(store, run_id=run_id, tool_call_id='call-drop', result='dropped users')

    _on_store(spec, approve)
    _kill_inside_the_drop(spec, world, run_id)
    time.sleep(2.5)

    async def settle(store: StepStore) -> None:
        await supply_result(store, run_id=run_id, tool_call_id='call-drop', result='dropped users (checked)')
        result = await resume_run(store, run_id=run_id, agent=build(store, world))
        assert result.output == 'drop_table said: dropped users (checked)'

    _on_store(spec, settle)
    assert _effects(world) == ['count users', 'drop users']  # not run again


# --- in one process: denials, answers recorded once, deadlines, what a paused run looks like -------------


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    returned = {p.tool_call_id: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if 'call-drop' in returned:
        return ModelResponse(parts=[TextPart(f'drop: {returned["call-drop"]}; ask: {returned.get("call-ask", "-")}')])
    return ModelResponse(
        parts=[
            ToolCallPart('count_rows', {'table': 'users'}, tool_call_id='call-count'),
            ToolCallPart('drop_table', {'name': 'users'}, tool_call_id='call-drop'),
            ToolCallPart('ask_owner', {'question': 'backup?'}, tool_call_id='call-ask'),
        ]
    )


def _agent(store: StepStore, world: Path, **options: Any) -> Agent[None, Any]:
    agent = Agent(
        FunctionModel(_model),
        name='dba',
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store=store, **options)],
    )

    def effect(line: str) -> None:
        with (world / 'effects.txt').open('a') as f:
            f.write(line + '\n')

    @agent.tool_plain
    def count_rows(table: str) -> int:  # pyright: ignore[reportUnusedFunction]
        effect(f'count {table}')
        return 3

    @agent.tool_plain(requires_approval=True)
    def drop_table(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
        effect(f'drop {name}')
        return f'dropped {name}'

    @agent.tool_plain
    def ask_owner(question: str) -> str:  # pyright: ignore[reportUnusedFunction]
        raise CallDeferred

    return agent


async def test_a_denied_call_reaches_the_model_as_denied(spec: dict[str, Any], world: Path) -> None:
    store = stepcore.from_spec(**spec)
    try:
        agent = _agent(store, world)
        paused = await agent.run('drop it')
        run_id = paused.run_id
        waiting = await read_waiting(store, run_id=run_id)
        assert waiting is not None
        assert [(c.tool_call_id, c.kind) for c in waiting.calls] == [
            ('call-drop', 'approval'),
            ('call-ask', 'external'),
        ]
        with pytest.raises(RuntimeError, match=r'waits for answers to deferred tool calls: drop_table \(call-drop'):
            await resume_run(store, run_id=run_id, agent=agent)
        await deny_call(store, run_id=run_id, tool_call_id='call-drop', message='not on a Friday', by='carol')
        await answer_call(store, run_id=run_id, tool_call_id='call-ask', result={'backup': True}, by='owner')
        result = await resume_run(store, run_id=run_id, agent=agent)
        assert result.output == "drop: not on a Friday; ask: {'backup': True}"
        assert _effects(world) == ['count users']  # denied: never ran
        # the paused run keeps its answers, with who and when; it was resumed once
        after = await read_waiting(store, run_id=run_id)
        assert after is not None
        assert after.resumed_by == result.run_id
        assert after.answers['call-drop'].by == 'carol'
        assert after.answers['call-drop'].decision == 'denied'
    finally:
        await store.aclose()


async def test_answers_are_recorded_once(spec: dict[str, Any], world: Path) -> None:
    store = stepcore.from_spec(**spec)
    try:
        agent = _agent(store, world)
        run_id = (await agent.run('drop it')).run_id
        first = await approve_call(store, run_id=run_id, tool_call_id='call-drop', by='alice')
        # the same answer again is harmless and keeps the first record
        again = await approve_call(store, run_id=run_id, tool_call_id='call-drop', by='bob')
        assert again == first
        assert again.by == 'alice'
        with pytest.raises(AnswerConflictError, match=r'already answered: approved by alice at .*yours \(denied\)'):
            await deny_call(store, run_id=run_id, tool_call_id='call-drop', by='bob')
        with pytest.raises(AnswerConflictError):
            await approve_call(store, run_id=run_id, tool_call_id='call-drop', override_args={'name': 'x'})
        # answers given at the same moment: exactly one stands, and every answerer is told which
        outcomes = await asyncio.gather(
            *(
                answer_call(store, run_id=run_id, tool_call_id='call-ask', result=f'answer {n}', by=f'p{n}')
                for n in range(6)
            ),
            return_exceptions=True,
        )
        kept = [o for o in outcomes if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, AnswerConflictError)]
        assert len(kept) == 1, outcomes
        assert len(refused) == 5, outcomes
        waiting = await read_waiting(store, run_id=run_id)
        assert waiting is not None
        assert waiting.answers['call-ask'] == kept[0]
        # bad input: a clear error, nothing recorded
        with pytest.raises(ValueError, match='it waits for a result from outside, not for this; use answer_call'):
            await approve_call(store, run_id=run_id, tool_call_id='call-ask')
        with pytest.raises(LookupError, match=r"waits on no tool call 'call-nope'; it waits on call-drop"):
            await approve_call(store, run_id=run_id, tool_call_id='call-nope')
        with pytest.raises(LookupError, match="there is no run 'no-such-run'"):
            await approve_call(store, run_id='no-such-run', tool_call_id='call-drop')
        other = (await agent.run('drop it')).run_id
        with pytest.raises(ValueError, match='is not JSON-serializable'):
            await answer_call(store, run_id=other, tool_call_id='call-ask', result=object())
        with pytest.raises(ValueError, match='must map argument names to values'):
            await approve_call(store, run_id=other, tool_call_id='call-drop', override_args=['x'])  # type: ignore[arg-type]
        pending = await read_waiting(store, run_id=other)
        assert pending is not None
        assert dict(pending.answers) == {}
    finally:
        await store.aclose()


async def test_an_unanswered_call_expires_at_its_deadline(spec: dict[str, Any], world: Path) -> None:
    store = stepcore.from_spec(**spec)
    try:
        agent = _agent(store, world, answer_within={'drop_table': timedelta(milliseconds=300)})
        run_id = (await agent.run('drop it')).run_id
        waiting = await read_waiting(store, run_id=run_id)
        assert waiting is not None
        drop, ask = waiting.calls
        assert drop.deadline is not None  # only drop_table has one
        assert ask.deadline is None
        await fail_call(store, run_id=run_id, tool_call_id='call-ask', message='the owner is away')
        await asyncio.sleep(0.4)
        with pytest.raises(RequestExpiredError, match=r"'call-drop' \(drop_table\) of run .* expired at"):
            await approve_call(store, run_id=run_id, tool_call_id='call-drop', by='late')
        result = await resume_run(store, run_id=run_id, agent=agent)
        assert result.output.startswith('drop: The request to run drop_table was not answered before its deadline')
        assert 'ask: the owner is away' in result.output
        assert _effects(world) == ['count users']
    finally:
        await store.aclose()


async def test_continue_run_of_a_paused_run_is_the_paused_history(spec: dict[str, Any], world: Path) -> None:
    store = stepcore.from_spec(**spec)
    try:
        agent = build(store, world)
        paused = await agent.run('drop it')
        history = await continue_run(store, run_id=paused.run_id)
        assert history == paused.all_messages()  # its deferred call open, count_rows's result in
        # pydantic-ai's own way of resuming works from it (stepcore records a new run, no claim)
        results = DeferredToolResults(approvals={'call-drop': True})
        done = await agent.run(message_history=history, deferred_tool_results=results)
        assert done.output == 'drop_table said: dropped users'
        # a run that did not pause: continue_run as before, and nothing to answer
        assert await continue_run(store, run_id=done.run_id) == done.all_messages()
        with pytest.raises(ValueError, match=r'did not pause on deferred tool calls \(it is completed\)'):
            await approve_call(store, run_id=done.run_id, tool_call_id='call-drop')
    finally:
        await store.aclose()


def test_answer_within_is_checked() -> None:
    for bad in (0, -1, float('inf'), 'soon', {'drop_table': 0}, {3: 10}):
        with pytest.raises(ValueError, match='answer_within'):
            StepPersistence(answer_within=bad)  # type: ignore[arg-type]


def test_the_answer_command_checks_its_options(tmp_path: Path, world: Path) -> None:
    from typer.testing import CliRunner

    from stepcore.cli import app

    spec = {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')}

    async def pause(store: StepStore) -> str:
        return (await build(store, world).run('drop it')).run_id

    run_id = _on_store(spec, pause)
    url = _url(spec)

    def answer(*args: str) -> Any:
        return CliRunner().invoke(app, ['answer', run_id, 'call-drop', *args, '--store', url], env={'COLUMNS': '200'})

    cases = {
        (): 'give exactly one of --approve, --deny, --result JSON or --fail TEXT',
        (
            '--approve',
            '--deny',
        ): 'give exactly one of --approve, --deny, --result JSON or --fail TEXT (got --approve, --deny)',
        ('--deny', '--args', '{}'): '--args goes with --approve',
        ('--approve', '--message', 'no'): '--message goes with --deny',
        ('--approve', '--args', 'name=guests'): "--args 'name=guests' is not JSON",
        ('--approve', '--args', '["guests"]'): 'is not a JSON object: write the arguments by name',
        ('--result', '"done"'): 'it waits for an approval, not for this; use --approve or --deny',
    }
    for args, message in cases.items():
        result = answer(*args)
        assert result.exit_code == 1, (args, result.output)
        assert message in result.stderr, (args, result.stderr)

    async def unanswered(store: StepStore) -> dict[str, Any]:
        waiting = await read_waiting(store, run_id=run_id)
        assert waiting is not None
        return dict(waiting.answers)

    assert _on_store(spec, unanswered) == {}
    done = answer('--deny', '--message', 'not today', '--by', 'carol', '--json')
    assert done.exit_code == 0, done.stderr
    recorded = json.loads(done.stdout)
    assert (recorded['decision'], recorded['message'], recorded['by']) == ('denied', 'not today', 'carol')
