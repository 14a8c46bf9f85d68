"""What the command line says of a run matches how the run stands, on a real SQLite store.

A run a live owner holds has tool calls running, not unresolved, and no advice meant for a crash. A
run that completed, or that another run resumed, is offered no resumption. A run that paused on
deferred tool calls keeps its answers in its story: `events` lists them as answers, `recover` and
`show` say who answered each call, when, and how, before the run is resumed and after, and so does
the run that resumed it. The runs are made by a real `pydantic_ai.Agent` with `StepPersistence`;
a live run is held inside its tool, in a thread of this process, while the commands look at it.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from live_run import LiveRun, send_model
from pydantic_ai import Agent, CallDeferred
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from rich.console import Console
from typer.testing import CliRunner

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence, answer_call, approve_call, deny_call, resume_run
from stepcore.cli import app
from stepcore.cli._loop import run_coroutine
from stepcore.cli.demo import run_demo

runner = CliRunner()

PYTHON_WORDS = ('resolve_run', 'resume_run', 'approve_call', 'deny_call', 'continue_run', 'force=True', "{'name'")
"""What no line of the command line says: it names commands and flags, and shows values as JSON."""
CRASH_WORDS = ('unresolved', 'Unresolved', 'may or may not', 'cannot be continued', '--supply', '--mark-checked')
"""What the command line says of calls a crash cut short, and of nothing else."""


_BORDERS = str.maketrans({c: ' ' for c in '│┃┏┓┗┛┡┩└┘┳┻╇╈┼━─┯┷┠┨'})


def cli(*args: str, columns: int = 200) -> Any:
    return runner.invoke(app, list(args), env={'COLUMNS': str(columns), 'NO_COLOR': '1'})


def said(*args: str, code: int = 0, columns: int = 200) -> str:
    """The command's output, its words joined with single spaces (table borders and wrapping aside)."""
    result = cli(*args, columns=columns)
    assert result.exit_code == code, (result.stdout, result.stderr)
    return ' '.join(result.stdout.translate(_BORDERS).split())


def as_json(*args: str, code: int = 0) -> Any:
    result = cli(*args, '--json')
    assert result.exit_code == code, (result.stdout, result.stderr)
    return json.loads(result.stdout)


# --- a run that paused, its answers, the run that resumed it ------------------------------------------------


def _dba_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    returned = {p.tool_call_id: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if 'call-drop' in returned:
        told = '; '.join(f'{call}: {returned[call]}' for call in ('call-drop', 'call-trunc', 'call-ask'))
        return ModelResponse(parts=[TextPart(told)])
    return ModelResponse(
        parts=[
            ToolCallPart('count_rows', {'table': 'users'}, tool_call_id='call-count'),
            ToolCallPart('drop_table', {'name': 'users'}, tool_call_id='call-drop'),
            ToolCallPart('truncate', {'name': 'logs'}, tool_call_id='call-trunc'),
            ToolCallPart('archive', {'name': 'audit'}, tool_call_id='call-archive'),
            ToolCallPart('ask_owner', {'question': 'keep a backup?'}, tool_call_id='call-ask'),
        ]
    )


def _dba(store: SqliteStepStore) -> Agent[None, Any]:
    agent = Agent(
        FunctionModel(_dba_model),
        name='dba',
        output_type=[str, DeferredToolRequests],
        # archive's request expires before anybody answers it: it is denied on resume
        capabilities=[StepPersistence(store=store, answer_within={'archive': timedelta(milliseconds=200)})],
    )

    @agent.tool_plain
    def count_rows(table: str) -> int:  # pyright: ignore[reportUnusedFunction]
        return 3

    @agent.tool_plain(requires_approval=True)
    def drop_table(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'dropped {name}'

    @agent.tool_plain(requires_approval=True)
    def truncate(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'truncated {name}'

    @agent.tool_plain(requires_approval=True)
    def archive(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'archived {name}'

    @agent.tool_plain
    def ask_owner(question: str) -> str:  # pyright: ignore[reportUnusedFunction]
        raise CallDeferred

    return agent


@dataclass
class Runs:
    url: str
    resumed: str
    """`ops-1` paused, was answered and resumed: the run that resumed it (completed)."""


async def _fill(database: Path) -> str:
    store = SqliteStepStore(database=database)
    try:
        agent = _dba(store)
        for run_id in ('ops-1', 'ops-2'):
            paused = await agent.run('clean up the database', run_id=run_id)
            assert isinstance(paused.output, DeferredToolRequests)
            await approve_call(
                store, run_id=run_id, tool_call_id='call-drop', override_args={'name': 'users_old'}, by='alice'
            )
        await deny_call(store, run_id='ops-1', tool_call_id='call-trunc', message='not on a Friday', by='bob')
        await answer_call(store, run_id='ops-1', tool_call_id='call-ask', result={'backup': True}, by='owner')
        await asyncio.sleep(0.3)  # archive's deadline passes unanswered
        resumed = await resume_run(store, run_id='ops-1', agent=agent)
        assert resumed.output == "call-drop: dropped users_old; call-trunc: not on a Friday; call-ask: {'backup': True}"
        sender = Agent(FunctionModel(send_model), name='mailer', capabilities=[StepPersistence(store=store)])

        @sender.tool_plain
        def send(to: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'sent to {to}'

        await sender.run('send it', run_id='done-1')
        return resumed.run_id
    finally:
        await store.aclose()


@pytest.fixture(scope='module')
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    database = tmp_path_factory.mktemp('wording') / 'runs.db'
    resumed = run_coroutine(_fill(database))
    return Runs(url=f'sqlite:///{database}', resumed=resumed)


def test_events_lists_answers_as_answers_and_json_keeps_the_stored_kind(runs: Runs) -> None:
    text = said('events', 'ops-1', '-s', runs.url, columns=400)
    assert text.count('call_answered') == 4
    assert 'call_answered drop_table call-drop approved by alice, to run with {"name": "users_old"} instead' in text
    assert 'call_answered truncate call-trunc denied by bob: not on a Friday' in text
    assert 'call_answered ask_owner call-ask answered by owner with the result {"backup": true}' in text
    assert 'call_answered archive call-archive expired: The request to run archive was not answered' in text
    assert 'tool_call_completed drop_table' not in text  # a denial or an approval is no end of a call
    assert 'tool_call_completed truncate' not in text
    assert 'tool_call_completed count_rows' in text  # count_rows did run

    events = as_json('events', 'ops-1', '-s', runs.url)
    answers = {e['tool_call_id']: e for e in events if e['answer'] is not None}
    assert set(answers) == {'call-drop', 'call-trunc', 'call-ask', 'call-archive'}
    for event in answers.values():
        assert event['kind'] == 'tool_call_completed'  # as stored
        assert 'stepcore.answer' in event['metadata']  # every stored field is still there
        assert {'seq', 'step_index', 'timestamp', 'idempotency_key', 'tool_name'} <= set(event)
    drop = answers['call-drop']['answer']
    assert (drop['decision'], drop['by'], drop['override_args']) == ('approved', 'alice', {'name': 'users_old'})
    assert drop['at']
    trunc = answers['call-trunc']['answer']
    assert (trunc['decision'], trunc['by'], trunc['message']) == ('denied', 'bob', 'not on a Friday')
    assert answers['call-ask']['answer']['result'] == {'backup': True}
    assert answers['call-archive']['answer']['decision'] == 'expired'
    assert all(e['answer'] is None for e in events if e['tool_call_id'] not in answers)


def test_recover_and_show_list_the_answers_of_a_resumed_pause(runs: Runs) -> None:
    for text in (said('recover', 'ops-1', '-s', runs.url), said('show', 'ops-1', '-s', runs.url)):
        assert f'run {runs.resumed} resumed it with these answers:' in text
        assert 'drop_table (call-drop) asked for approval, args {"name": "users"}: approved by alice at ' in text
        assert 'UTC, to run with {"name": "users_old"} instead' in text
        assert 'truncate (call-trunc) asked for approval, args {"name": "logs"}: denied by bob at ' in text
        assert 'UTC: not on a Friday' in text
        assert 'ask_owner (call-ask) asked for its result from outside (external)' in text
        assert 'answered by owner at ' in text
        assert 'archive (call-archive) asked for approval, args {"name": "audit"}: expired at ' in text
        assert 'was not answered before its deadline' in text
        assert not any(word in text for word in (*PYTHON_WORDS, *CRASH_WORDS)), text
    recovered = said('recover', 'ops-1', '-s', runs.url)
    assert f'Resumed by {runs.resumed} (completed): a resumed run is never resumed again' in recovered
    assert 'Nothing left to do' in recovered
    assert 'stepcore resume' not in recovered
    shown = said('show', 'ops-1', '-s', runs.url)
    assert 'snapshot seq 1, step 1, paused: its deferred tool calls open' in shown
    assert 'interrupted' not in shown

    # the run that resumed it: the answers it carried on with, and nothing to resume (it completed)
    for text in (said('recover', runs.resumed, '-s', runs.url), said('show', runs.resumed, '-s', runs.url)):
        assert 'It resumes run ops-1, which paused on deferred tool calls at ' in text
        assert 'it carried on with these answers:' in text
        assert 'approved by alice at ' in text
        assert 'denied by bob at ' in text
    recovered = said('recover', runs.resumed, '-s', runs.url)
    assert f'Completed: run {runs.resumed} has nothing left to do' in recovered
    assert 'Next:' not in recovered
    assert 'stepcore resume' not in recovered


def test_a_paused_run_lists_the_answers_it_has(runs: Runs) -> None:
    text = said('recover', 'ops-2', '-s', runs.url, code=4)
    assert 'Paused on deferred tool calls since ' in text
    assert 'drop_table (call-drop) needs approval, args {"name": "users"}: approved by alice at ' in text
    assert 'UTC, to run with {"name": "users_old"} instead' in text
    assert 'truncate (call-trunc) needs approval, args {"name": "logs"}: waiting for an answer' in text
    assert 'Next: answer each call with `stepcore answer ops-2 CALL --approve' in text
    assert not any(word in text for word in (*PYTHON_WORDS, *CRASH_WORDS)), text
    shown = said('show', 'ops-2', '-s', runs.url)
    assert 'Paused on deferred tool calls since ' in shown
    assert 'approved by alice at ' in shown
    assert "{'name'" not in shown


def test_a_resumed_pause_is_listed_as_resumed(runs: Runs) -> None:
    listed = {row['run_id']: row for row in as_json('runs', '-s', runs.url)}
    ops = listed['ops-1']
    assert (ops['status'], ops['ownership']) == ('waiting', 'resumed')  # as before: fields keep their values
    assert ops['standing'] == f'resumed by {runs.resumed} (completed)'
    table = cli('runs', '-s', runs.url).stdout
    [row] = [line for line in table.splitlines() if ' ops-1 ' in line]
    assert f'resumed by {runs.resumed} (completed)' in row
    assert 'waiting' not in row
    tree = said('tree', 'ops-1', '-s', runs.url)
    assert f'ops-1 [dba] resumed by {runs.resumed}' in tree
    assert 'waiting' not in tree
    assert as_json('tree', 'ops-1', '-s', runs.url)['resumed_by'] == runs.resumed


def test_a_completed_run_is_offered_no_resumption(runs: Runs, tmp_path: Path) -> None:
    text = said('recover', 'done-1', '-s', runs.url)
    assert 'Completed: run done-1 has nothing left to do.' in text
    assert 'Next:' not in text
    assert 'stepcore resume' not in text
    assert 'resumes it from its first request' not in text
    # copied into another store, the runs have no leases: their events say how they ended
    copy = f'sqlite:///{tmp_path / "copy.db"}'
    for run_id in ('done-1', 'ops-1', runs.resumed):
        exported = tmp_path / f'{run_id}.json'
        said('export', run_id, '-s', runs.url, '--output', str(exported))
        said('import', str(exported), '-s', copy)
    for run_id in ('done-1', runs.resumed):
        text = said('recover', run_id, '-s', copy)
        assert f'Completed: run {run_id} has nothing left to do.' in text
        assert 'stepcore resume' not in text
        assert 'This store keeps no leases' not in text
    text = said('recover', 'ops-1', '-s', copy)
    assert f'Resumed by {runs.resumed} (completed)' in text
    assert 'approved by alice at ' in text
    assert 'stepcore resume' not in text


# --- a live run, and an orphan --------------------------------------------------------------------------------


@pytest.fixture
def orphan_db(tmp_path: Path) -> Path:
    """The demo's database before it resumes: report-run-1 killed inside send_email, its owner gone."""
    database = tmp_path / 'demo.db'
    run_demo(database, console=Console(file=io.StringIO()), resume=False)
    return database


def test_a_live_run_has_calls_running_and_an_orphan_has_them_unresolved(orphan_db: Path) -> None:
    url = f'sqlite:///{orphan_db}'
    with LiveRun(orphan_db, 'live-1') as live:
        text = said('recover', 'live-1', '-s', url)
        assert 'Running now on ' in text
        assert 'recovery refuses a live run, and nothing of it needs recovering while it runs' in text
        assert 'No settled snapshot yet: its first step is under way.' in text
        assert 'Tool call running now (started, no result yet): - send (call-send) started' in text
        assert 'Next: nothing while it runs; `stepcore recover live-1` tells how it stands once it ends.' in text
        assert not any(word in text for word in (*PYTHON_WORDS, *CRASH_WORDS)), text
        assert 'stepcore resume' not in text  # nothing to resume: its owner is alive
        assert 'start point' not in text
        assert re.search(r'ownership \(running on .+, epoch 1, held until [^()]+\):', text), text
        assert text.count('epoch 1') == 3, text  # the lease line, the ownership header, its history line
        report = as_json('recover', 'live-1', '-s', url)
        assert report['lease']['live'] is True
        assert [e['tool_call_id'] for e in report['unresolved_effects']] == ['call-send']  # as stored
        tree = said('tree', 'live-1', '-s', url)
        assert 'live-1 [mailer] unfinished 1 tool call running' in tree
        assert 'unresolved' not in tree
        assert as_json('tree', 'live-1', '-s', url)['running'] is True
        effects = said('effects', 'live-1', '-s', url)
        assert 'run live-1 is running: its call still started is running now, not cut short' in effects
        listed = said('runs', '-s', url)
        assert 'running on ' in listed
    assert live.output == 'sent'
    ended = said('recover', 'live-1', '-s', url)
    assert 'Completed: run live-1 has nothing left to do.' in ended
    assert 'Next:' not in ended

    # the orphan keeps the words and the advice of a crash
    text = said('recover', 'report-run-1', '-s', url)
    assert 'Orphaned: its lease (taken by ' in text
    assert 'has no live owner. Any worker may claim and resume it' in text
    assert 'Unresolved tool calls: started, never finished. Each may or may not have had its effect:' in text
    assert '`stepcore recover report-run-1 --supply CALL=RESULT`' in text
    assert 'Next: `stepcore resume report-run-1 --agent MODULE:ATTR` to settle the calls and resume.' in text
    assert not any(word in text for word in PYTHON_WORDS), text
    assert '1 unresolved tool effect' in said('tree', 'report-run-1', '-s', url)
    assert 'running now' not in said('effects', 'report-run-1', '-s', url)
