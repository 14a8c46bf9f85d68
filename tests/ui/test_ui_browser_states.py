"""The inspector in a real headless Chromium on runs in three states: a pause another run resumed, the
run that resumed it (completed), and a run a live owner holds, inside its tool.

The runs are made by a real `pydantic_ai.Agent` with `StepPersistence` on SQLite; the live run is
held inside its tool, in a thread of this process, while the browser reads its pages. Screenshots go
where conftest.py says.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from live_run import LiveRun
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence, approve_call, deny_call, resume_run
from stepcore.cli._loop import run_coroutine

RESUME_TITLE = 'Resume the run (settling what a crash cut short)'


def _wait(browser: Any) -> WebDriverWait[Any]:
    return WebDriverWait(browser, 60)


def _dba_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    returned = {p.tool_call_id: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if 'call-drop' in returned:
        return ModelResponse(parts=[TextPart(f'drop: {returned["call-drop"]}; truncate: {returned["call-trunc"]}')])
    return ModelResponse(
        parts=[
            ToolCallPart('drop_table', {'name': 'users'}, tool_call_id='call-drop'),
            ToolCallPart('truncate', {'name': 'logs'}, tool_call_id='call-trunc'),
        ]
    )


async def _fill(database: Path) -> str:
    """`ops-1` paused, was answered (an approval with other arguments, a denial) and resumed; answers the
    run that resumed it."""
    store = SqliteStepStore(database=database)
    try:
        agent = Agent(
            FunctionModel(_dba_model),
            name='dba',
            output_type=[str, DeferredToolRequests],
            capabilities=[StepPersistence(store=store)],
        )

        @agent.tool_plain(requires_approval=True)
        def drop_table(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'dropped {name}'

        @agent.tool_plain(requires_approval=True)
        def truncate(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'truncated {name}'

        assert isinstance((await agent.run('clean up', run_id='ops-1')).output, DeferredToolRequests)
        await approve_call(store, run_id='ops-1', tool_call_id='call-drop', override_args={'name': 'old'}, by='alice')
        await deny_call(store, run_id='ops-1', tool_call_id='call-trunc', message='not on a Friday', by='bob')
        resumed = await resume_run(store, run_id='ops-1', agent=agent)
        assert resumed.output == 'drop: dropped old; truncate: not on a Friday'
        return resumed.run_id
    finally:
        await store.aclose()


@dataclass
class Served:
    ui: Any
    database: Path
    resumed: str


@pytest.fixture(scope='module')
def served(tmp_path_factory: pytest.TempPathFactory, serve: Callable[..., Any]) -> Served:
    database = tmp_path_factory.mktemp('ui-states') / 'runs.db'
    resumed = run_coroutine(_fill(database))
    return Served(ui=serve('--store', f'sqlite:///{database}'), database=database, resumed=resumed)


def _rows(browser: Any) -> dict[str, Any]:
    rows = _wait(browser).until(ec.presence_of_all_elements_located((By.CSS_SELECTOR, 'table.runs tbody tr')))
    return {row.find_element(By.CSS_SELECTOR, 'a.run-id').text: row for row in rows}


def _snippet_titles(browser: Any) -> list[str]:
    return [head.text for head in browser.find_elements(By.CSS_SELECTOR, '.snippet-head span')]


def test_a_resumed_pause_and_the_run_that_resumed_it(
    browser: Any, served: Served, shoot: Callable[[str], Path]
) -> None:
    browser.get(served.ui.base + '/')
    row = _rows(browser)['ops-1']
    assert row.find_elements(By.CSS_SELECTOR, '.badge.status-waiting') == []
    assert (
        f'resumed by {served.resumed} (completed)' in row.find_element(By.CSS_SELECTOR, '.badge.ownership-resumed').text
    )
    shoot('states-1-runs')

    row.find_element(By.LINK_TEXT, 'ops-1').click()
    answers = _wait(browser).until(ec.presence_of_element_located((By.ID, 'answers')))
    heading = browser.find_element(By.TAG_NAME, 'h1')
    assert heading.find_elements(By.CSS_SELECTOR, '.badge.status-waiting') == []
    assert f'resumed by {served.resumed} (completed)' in browser.find_element(By.ID, 'ownership').text
    recovery = browser.find_element(By.ID, 'recovery').text
    assert f'Resumed by {served.resumed} (completed)' in recovery
    assert 'No settled snapshot' not in recovery
    assert 'resolve_run' not in recovery
    assert RESUME_TITLE not in _snippet_titles(browser)
    drop = browser.find_element(By.ID, 'answer-call-drop')
    assert drop.find_element(By.CSS_SELECTOR, '.badge.answer-approved').text == 'approved'
    assert drop.find_element(By.CSS_SELECTOR, 'td.by').text == 'alice'
    assert json.loads(drop.find_element(By.CSS_SELECTOR, 'pre.override-args').text) == {'name': 'old'}
    trunc = browser.find_element(By.ID, 'answer-call-trunc')
    assert trunc.find_element(By.CSS_SELECTOR, '.badge.answer-denied').text == 'denied'
    assert trunc.find_element(By.CSS_SELECTOR, 'td.by').text == 'bob'
    assert 'the model was told: not on a Friday' in trunc.text
    assert served.resumed in answers.text
    shoot('states-2-resumed-pause')

    # the timeline: the answers are answers, not ends of calls
    browser.find_element(By.LINK_TEXT, 'timeline').click()
    answered = _wait(browser).until(
        ec.presence_of_all_elements_located((By.CSS_SELECTOR, 'table.timeline tr.kind-call_answered'))
    )
    assert len(answered) == 2
    assert any('approved' in r.text and 'by alice' in r.text for r in answered)
    assert any('denied' in r.text and 'by bob' in r.text for r in answered)
    shoot('states-3-timeline')

    # the run that resumed it: completed, the answers it carried on with, and nothing to resume
    browser.get(served.ui.base + f'/runs/{served.resumed}')
    answers = _wait(browser).until(ec.presence_of_element_located((By.ID, 'answers')))
    assert 'which this run resumes' in answers.text
    assert browser.find_element(By.CSS_SELECTOR, 'h1 .badge.status-completed').text == 'completed'
    assert RESUME_TITLE not in _snippet_titles(browser)
    assert 'Fork it (a new branch from the same point)' in _snippet_titles(browser)
    assert 'approved' in browser.find_element(By.ID, 'answer-call-drop').text
    shoot('states-4-completed-resumption')
    answers.find_element(By.LINK_TEXT, 'ops-1').click()
    _wait(browser).until(ec.presence_of_element_located((By.ID, 'resumed-by')))


def test_a_live_run_inside_its_tool(browser: Any, served: Served, shoot: Callable[[str], Path]) -> None:
    with LiveRun(served.database, 'live-1'):
        browser.get(served.ui.base + '/')
        row = _rows(browser)['live-1']
        assert row.find_element(By.CSS_SELECTOR, '.badge.running').text == '1 running'
        assert row.find_elements(By.CSS_SELECTOR, '.badge.unresolved') == []
        assert 'running on ' in row.find_element(By.CSS_SELECTOR, '.badge.ownership-running').text
        shoot('states-5-live-runs')

        row.find_element(By.LINK_TEXT, 'live-1').click()
        running = _wait(browser).until(ec.presence_of_element_located((By.ID, 'running-calls')))
        assert '1 tool call running' in running.text
        assert 'send (call-send) with arguments' in running.text
        assert 'recovery refuses a live run' in browser.find_element(By.ID, 'live').text
        recovery = browser.find_element(By.ID, 'recovery').text
        for crash in ('unresolved', 'may or may not', 'cannot be continued', 'resolve_run', 'No settled snapshot,'):
            assert crash not in recovery
        assert browser.find_elements(By.ID, 'continuable') == []
        assert browser.find_elements(By.CSS_SELECTOR, '.snippet') == []
        assert browser.find_elements(By.CSS_SELECTOR, '#ledger tr.unresolved') == []
        [entry] = browser.find_elements(By.CSS_SELECTOR, '#ledger tr.running')
        assert entry.find_element(By.CSS_SELECTOR, '.badge.running').text == 'running'
        shoot('states-6-live-run')
