"""What the inspector's pages say of a run matches how the run stands, over HTTP on a real SQLite store.

A run a live owner holds has tool calls running, not unresolved, and no advice or code meant for a
crash. A run that completed, or that another run resumed, is offered no resumption. A pause another
run resumed shows as resumed, not waiting, and keeps its answers: the run page lists them (who, when,
the decision, the arguments an approval changed, the message of a denial, an expiry), so does the
page of the run that resumed it, and the timeline shows them as answers. The runs are made by a real
`pydantic_ai.Agent` with `StepPersistence`; a live run is held inside its tool, in a thread of this
process, while the pages are read.
"""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from live_run import LiveRun, send_model
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence, approve_call, deny_call, resume_run
from stepcore.cli._loop import run_coroutine

CRASH_WORDS = ('unresolved', 'may or may not', 'cannot be continued', 'cut-short', 'No settled snapshot, but')
RESUME_TITLE = 'Resume the run (settling what a crash cut short)'


def _dba_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    returned = {p.tool_call_id: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if 'call-drop' in returned:
        return ModelResponse(parts=[TextPart(f'drop: {returned["call-drop"]}; truncate: {returned["call-trunc"]}')])
    return ModelResponse(
        parts=[
            ToolCallPart('count_rows', {'table': 'users'}, tool_call_id='call-count'),
            ToolCallPart('drop_table', {'name': 'users'}, tool_call_id='call-drop'),
            ToolCallPart('truncate', {'name': 'logs'}, tool_call_id='call-trunc'),
            ToolCallPart('archive', {'name': 'audit'}, tool_call_id='call-archive'),
        ]
    )


async def _fill(database: Path) -> str:
    """`ops-1` paused, answered (an approval with other arguments, a denial, an expiry) and resumed;
    `ops-2` paused with one answer so far; `done-1` completed. Answers the run that resumed `ops-1`."""
    store = SqliteStepStore(database=database)
    try:
        agent = Agent(
            FunctionModel(_dba_model),
            name='dba',
            output_type=[str, DeferredToolRequests],
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

        for run_id in ('ops-1', 'ops-2'):
            assert isinstance((await agent.run('clean up', run_id=run_id)).output, DeferredToolRequests)
            await approve_call(
                store, run_id=run_id, tool_call_id='call-drop', override_args={'name': 'users_old'}, by='alice'
            )
        await deny_call(store, run_id='ops-1', tool_call_id='call-trunc', message='not on a Friday', by='bob')
        await asyncio.sleep(0.3)  # archive's deadline passes unanswered: it is denied on resume
        resumed = await resume_run(store, run_id='ops-1', agent=agent)
        assert resumed.output == 'drop: dropped users_old; truncate: not on a Friday'
        sender = Agent(FunctionModel(send_model), name='mailer', capabilities=[StepPersistence(store=store)])

        @sender.tool_plain
        def send(to: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'sent to {to}'

        await sender.run('send it', run_id='done-1')
        return resumed.run_id
    finally:
        await store.aclose()


@dataclass
class Served:
    ui: Any
    database: Path
    resumed: str

    def page(self, path: str) -> str:
        found = self.ui.get(path)
        assert found.status == 200, found.text
        return html.unescape(found.text)


@pytest.fixture(scope='module')
def served(tmp_path_factory: pytest.TempPathFactory, serve: Callable[..., Any]) -> Served:
    database = tmp_path_factory.mktemp('ui-wording') / 'runs.db'
    resumed = run_coroutine(_fill(database))
    return Served(ui=serve('--store', f'sqlite:///{database}'), database=database, resumed=resumed)


def _row(page: str, run_id: str) -> str:
    """The runs table's row of `run_id`."""
    rows = re.findall(r'<tr class="status-[^"]*">.*?</tr>', page, flags=re.S)
    [row] = [r for r in rows if f'href="/runs/{run_id}"' in r.split('</td>')[0]]
    return row


def _section(page: str, name: str) -> str:
    start = page.index(f'<section id="{name}">')
    return page[start : page.index('</section>', start)]


def _text(fragment: str) -> str:
    """What a person reads in `fragment`: its words, without the spaces its tags left before punctuation."""
    words = ' '.join(re.sub(r'<[^>]+>', ' ', fragment).split())
    return re.sub(r'\( ', '(', re.sub(r' ([:.,;)])', r'\1', words))


def test_a_resumed_pause_is_listed_as_resumed_not_waiting(served: Served) -> None:
    row = _row(served.page('/'), 'ops-1')
    assert 'status-waiting' not in row
    assert f'resumed by {served.resumed} (completed)' in _text(row)
    assert 'waiting' not in _text(row)
    paused = _row(served.page('/'), 'ops-2')  # the one nobody resumed yet still waits
    assert 'badge status-waiting' in paused


def test_the_page_of_a_resumed_pause_lists_its_answers(served: Served) -> None:
    page = served.page('/runs/ops-1')
    heading = page[page.index('<h1>') : page.index('</h1>')]
    assert 'status-waiting' not in heading
    assert f'resumed by {served.resumed} (completed)' in _text(heading)
    recovery = _text(_section(page, 'recovery'))
    assert f'Resumed by {served.resumed} (completed): a resumed run is never resumed again' in recovery
    assert 'Paused on 3 deferred tool calls at ' in recovery
    assert 'No settled snapshot' not in recovery
    assert 'resolve_run' not in recovery
    assert RESUME_TITLE not in page
    assert "fork_run(store, run_id='ops-1')" in page  # its paused history, as it is

    answers = _section(page, 'answers')
    assert f'href="/runs/{served.resumed}"' in answers
    drop = _text(answers[answers.index('id="answer-call-drop"') :].split('</tr>')[0])
    assert 'drop_table' in drop
    assert 'approved alice' in drop
    assert 'ran with these arguments instead: { "name": "users_old" }' in drop
    trunc = _text(answers[answers.index('id="answer-call-trunc"') :].split('</tr>')[0])
    assert 'denied bob' in trunc
    assert 'the model was told: not on a Friday' in trunc
    archive = _text(answers[answers.index('id="answer-call-archive"') :].split('</tr>')[0])
    assert 'expired stepcore (deadline)' in archive
    assert 'was not answered before its deadline' in archive


def test_the_run_that_resumed_a_pause_lists_its_answers_and_offers_no_resumption(served: Served) -> None:
    page = served.page(f'/runs/{served.resumed}')
    answers = _section(page, 'answers')
    assert 'href="/runs/ops-1"' in answers
    assert 'which this run resumes: it carried on with them' in _text(answers)
    assert 'id="answer-call-drop"' in answers
    assert 'id="answer-call-trunc"' in answers
    assert RESUME_TITLE not in page
    assert 'resolve_run(' not in page
    assert f"fork_run(store, run_id='{served.resumed}')" in page


def test_a_completed_run_offers_no_resumption(served: Served) -> None:
    page = served.page('/runs/done-1')
    assert RESUME_TITLE not in page
    assert 'resolve_run(' not in page
    assert "fork_run(store, run_id='done-1')" in page
    assert 'id="answers"' not in page  # it never paused


def test_a_paused_run_lists_the_answers_given_so_far(served: Served) -> None:
    page = served.page('/runs/ops-2')
    assert 'id="paused"' in page
    answers = _section(page, 'answers')
    assert 'The answers given so far' in _text(answers)
    drop = _text(answers[answers.index('id="answer-call-drop"') :].split('</tr>')[0])
    assert 'approved alice' in drop
    assert 'runs with these arguments instead: { "name": "users_old" }' in drop
    assert 'id="answer-call-trunc"' not in answers  # not answered yet: it is in the list of calls that wait


def test_the_timeline_shows_answers_as_answers(served: Served) -> None:
    page = served.page('/runs/ops-1/timeline')
    rows = re.findall(r'<tr class="kind-([^" ]+)[^"]*" id="e\d+">(.*?)</tr>', page, flags=re.S)
    answered = [_text(body) for kind, body in rows if kind == 'call_answered']
    assert len(answered) == 3
    assert any('approved by alice with arguments {"name": "users_old"} drop_table call-drop' in r for r in answered)
    assert any('denied by bob not on a Friday truncate call-trunc' in r for r in answered)
    assert any('expired by stepcore (deadline)' in r for r in answered)
    ends = [_text(body) for kind, body in rows if kind == 'tool_call_completed']
    assert [r for r in ends if 'drop_table' in r or 'truncate' in r] == []
    assert 'status-waiting' not in page[page.index('<h1>') : page.index('</h1>')]


def test_a_live_run_has_calls_running_with_no_crash_words(served: Served) -> None:
    with LiveRun(served.database, 'live-1'):
        row = _text(_row(served.page('/'), 'live-1'))
        assert 'running on ' in row
        assert '1 running' in row
        assert 'unresolved' not in row
        page = served.page('/runs/live-1')
        recovery = _section(page, 'recovery')
        said = _text(recovery)
        assert 'recovery refuses a live run, and nothing of it needs recovering while it runs' in said
        assert 'No settled snapshot yet: its first step is under way.' in said
        assert '1 tool call running: started, its result not in yet: send (call-send)' in said
        assert not any(word in said for word in CRASH_WORDS), said
        assert 'resolve_run' not in said
        assert 'id="continuable"' not in recovery
        assert 'class="snippet"' not in recovery
        ledger = _section(page, 'ledger')
        assert '<tr class="effect-started running">' in ledger
        assert 'may or may not' not in ledger
        assert '1 running' in _text(_section(page, 'lineage'))
        lease = _text(_section(page, 'ownership'))
        line = re.search(r'Its lease: (.+?)\. at \(UTC\) change', lease)  # the history's table follows it
        assert line is not None, lease
        assert re.fullmatch(r'running on .+, epoch 1, held until \S+', line[1]), line[1]  # the epoch said once
        timeline = served.page('/runs/live-1/timeline')
        started = _text(re.findall(r'<tr class="kind-tool_call_started open"[^>]*>(.*?)</tr>', timeline, re.S)[0])
        assert 'tool_call_started running send call-send' in started
        assert 'no end' not in timeline
    page = served.page('/runs/live-1')  # it ended: completed, nothing to resume
    assert 'badge status-completed' in page
    assert RESUME_TITLE not in page
    assert 'running' not in _text(_section(page, 'recovery'))


def test_an_orphan_keeps_the_words_and_advice_of_a_crash(killed_ui: Any) -> None:
    page = html.unescape(killed_ui.get('/runs/report-run-1').text)
    recovery = _text(_section(page, 'recovery'))
    assert 'Orphaned (owner gone): any worker may claim and resume it' in recovery
    assert 'Orphaned: orphaned' not in recovery
    assert '1 unresolved tool call: started and never finished, so each may or may not have had its effect' in recovery
    assert 'It cannot be continued as is' in recovery
    assert RESUME_TITLE in page
    row = _text(_row(html.unescape(killed_ui.get('/').text), 'report-run-1'))
    assert '1 unresolved' in row
    timeline = html.unescape(killed_ui.get('/runs/report-run-1/timeline').text)
    assert 'no end' in timeline
