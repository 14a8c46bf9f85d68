"""Who held a run, in a real headless Chromium: a run taken over from another host, its history.

A real `pydantic_ai.Agent` runs in a child process, on SQLite, under a lease a process on another host
took (`another-host.invalid`, pid 4242), which expired; the child is killed with SIGKILL inside its
tool. Recovery in this process takes the run over and resumes it, and a late write under the first
owner's epoch is refused by the store. The browser reads the run page, follows the links between the
run and its resumption both ways, opens the job they make, and the timeline. Screenshots go where
conftest.py says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from step_sqlite import SqliteStepStore
from stepcore import EventKind, StepEvent, StepPersistence, resolve_run
from stepcore.cli._loop import run_coroutine
from stepcore.ownership.identity import host_name
from stepcore.store.leases import Fence, RunFencedError, fencing

RUN_ID = 'ship-1'
HERE = f'{host_name()} pid {os.getpid()}'
"""This process, as a lease owner names it: recovery runs here."""

CHILD = textwrap.dedent(
    """
    import asyncio
    import sys
    import time
    from pathlib import Path

    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    from step_sqlite import SqliteStepStore
    from stepcore import StepPersistence
    from stepcore.ownership import open_lease
    from stepcore.store.leases import Owner

    database, marker, run_id = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]


    def model(messages, info):
        done = {p.tool_name for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
        if 'quote' in done:
            return ModelResponse(parts=[ToolCallPart('ship', {'order': 7}, tool_call_id='call-ship')])
        return ModelResponse(parts=[ToolCallPart('quote', {'order': 7}, tool_call_id='call-quote')])


    async def main():
        store = SqliteStepStore(database=database)
        # this process stands for one on another host: the run's lease is that host's, and it expired
        elsewhere = Owner(host='another-host.invalid', pid=4242, token='held-elsewhere')
        await open_lease(store, run_id, ttl=0.0, owner=elsewhere)
        agent = Agent(FunctionModel(model), name='shipper', capabilities=[StepPersistence(store=store, lease_ttl=None)])

        @agent.tool_plain
        def quote(order: int) -> str:
            return f'order {order}: 12 EUR'

        @agent.tool_plain
        def ship(order: int) -> str:
            marker.write_text('inside ship')
            time.sleep(600)  # killed here
            return 'never'

        await agent.run('ship order 7', run_id=run_id)


    asyncio.run(main())
    """
)


def _wait(browser: Any) -> WebDriverWait[Any]:
    return WebDriverWait(browser, 60)


def _ship_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    done = {p.tool_name for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if 'ship' in done:
        return ModelResponse(parts=[TextPart('shipped')])
    if 'quote' in done:
        return ModelResponse(parts=[ToolCallPart('ship', {'order': 7}, tool_call_id='call-ship')])
    return ModelResponse(parts=[ToolCallPart('quote', {'order': 7}, tool_call_id='call-quote')])


def _kill_inside_its_tool(database: Path, marker: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, '-c', CHILD, str(database), str(marker), RUN_ID],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f'the agent process exited before reaching its tool: {proc.communicate()[0]}')
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail('the agent process did not reach its tool in 120 s')
        time.sleep(0.02)
    proc.kill()  # SIGKILL: nothing of the run's end gets written
    proc.communicate()


async def _recover(database: Path) -> str:
    """Take the run over here, resume it, then have a write of its first owner (epoch 1) refused.
    Answers the resumption's id."""
    store = SqliteStepStore(database=database)
    try:
        agent = Agent(FunctionModel(_ship_model), name='shipper', capabilities=[StepPersistence(store=store)])

        @agent.tool_plain
        def quote(order: int) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'order {order}: 12 EUR'

        @agent.tool_plain
        def ship(order: int) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'order {order} shipped'

        resumption = await resolve_run(store, run_id=RUN_ID, agent=agent, policies={'ship': 'rerun'})
        result = await resumption.run(agent)
        assert result.output == 'shipped'
        late = StepEvent(run_id=RUN_ID, kind=EventKind.TOOL_CALL_COMPLETED, step_index=2, tool_call_id='call-ship')
        with fencing(Fence(RUN_ID, 1)), pytest.raises(RunFencedError):
            await store.append_event(late)
        return result.run_id
    finally:
        await store.aclose()


@dataclass
class Served:
    ui: Any
    resumed: str


@pytest.fixture(scope='module')
def served(tmp_path_factory: pytest.TempPathFactory, serve: Callable[..., Any]) -> Served:
    folder = tmp_path_factory.mktemp('ui-ownership-browser')
    database = folder / 'runs.db'
    _kill_inside_its_tool(database, folder / 'inside-ship')
    resumed = run_coroutine(_recover(database))
    return Served(ui=serve('--store', f'sqlite:///{database}'), resumed=resumed)


def _history(browser: Any) -> list[Any]:
    return browser.find_elements(By.CSS_SELECTOR, '#ownership table.ownership-history tbody tr')


def _kind(row: Any) -> str:
    return row.find_element(By.TAG_NAME, 'code').text


def test_a_run_taken_over_from_another_host_and_its_history(
    browser: Any, served: Served, shoot: Callable[[str], Path]
) -> None:
    browser.get(f'{served.ui.base}/runs/{RUN_ID}')
    _wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, '#ownership table.ownership-history')))
    rows = _history(browser)
    assert [_kind(r) for r in rows] == ['lease_taken', 'lease_taken_over', 'lease_handed_on', 'write_refused']
    taken, over, handed, refused = rows
    assert 'taken by another-host.invalid pid 4242 at epoch 1' in taken.text
    assert f'taken over by {HERE} (recovering it) from another-host.invalid pid 4242 at epoch 1' in over.text
    assert 'lease expired' in over.text
    assert over.find_element(By.CSS_SELECTOR, '.badge.takeover').text == 'taken over'
    assert f'handed to its resumption {served.resumed}' in handed.text
    assert f'write refused: {HERE} still held epoch 1 (the run is at epoch 3)' in refused.text
    assert refused.find_element(By.CSS_SELECTOR, '.badge.refused').text == 'write refused'
    assert taken.find_elements(By.CSS_SELECTOR, '.badge') == []
    # the takeover and the refused write stand out from the rest of the history
    plain = taken.value_of_css_property('background-color')
    assert over.value_of_css_property('background-color') != plain
    assert refused.value_of_css_property('background-color') not in (
        plain,
        over.value_of_css_property('background-color'),
    )
    resumed_on = browser.find_element(By.CSS_SELECTOR, '#ownership .resumed-on')
    assert f'Resumed by {served.resumed} on {HERE}' in resumed_on.text
    assert 'Part of job ship-1: 2 runs' in browser.find_element(By.ID, 'job').text
    shoot('ownership-1-taken-over')

    # the resumption's page, and back
    resumed_on.find_element(By.LINK_TEXT, served.resumed).click()
    _wait(browser).until(ec.url_contains(f'/runs/{served.resumed}'))
    resumes = _wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, '#ownership .resumes')))
    assert 'Resumes ship-1' in resumes.text
    assert [_kind(r) for r in _history(browser)] == ['lease_taken', 'lease_released']
    assert f'taken by {HERE} at epoch 3 (resumes run ship-1)' in _history(browser)[0].text
    shoot('ownership-2-resumption')
    resumes.find_element(By.LINK_TEXT, RUN_ID).click()
    _wait(browser).until(ec.url_contains(f'/runs/{RUN_ID}'))
    _wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, '#ownership .resumed-on')))

    # the job: both runs, oldest first, with who held each
    browser.find_element(By.CSS_SELECTOR, '#job a').click()
    _wait(browser).until(ec.url_contains('/jobs/ship-1'))
    runs = _wait(browser).until(ec.presence_of_all_elements_located((By.CSS_SELECTOR, 'li.job-run')))
    assert [r.find_element(By.CSS_SELECTOR, 'h2 a.run-id').text for r in runs] == [RUN_ID, served.resumed]
    assert browser.find_element(By.ID, 'job-status').text == 'completed'
    first, second = runs
    assert 'another-host.invalid pid 4242 at epoch 1' in first.text
    assert first.find_element(By.CSS_SELECTOR, '.badge.takeover').text == 'taken over'
    assert first.find_element(By.CSS_SELECTOR, '.badge.refused').text == 'write refused'
    assert 'resumed' in first.find_element(By.CSS_SELECTOR, '.lease-state').text
    assert 'Resumes ship-1' in second.text
    assert second.find_element(By.CSS_SELECTOR, 'h2 .badge.status-completed').text == 'completed'
    shoot('ownership-3-job')

    # the timeline: the changes among the events, by time, set apart from them
    browser.get(f'{served.ui.base}/runs/{RUN_ID}/timeline')
    rows = _wait(browser).until(ec.presence_of_all_elements_located((By.CSS_SELECTOR, 'table.timeline tbody tr')))
    kinds = [r.find_element(By.TAG_NAME, 'code').text for r in rows]
    changes = [k for k in kinds if k.startswith(('lease_', 'write_'))]
    assert changes == ['lease_taken', 'lease_taken_over', 'lease_handed_on', 'write_refused']
    assert kinds.index('lease_taken') < kinds.index('run_started')
    assert kinds.index('tool_call_started') < kinds.index('lease_taken_over')
    over = browser.find_element(By.CSS_SELECTOR, 'table.timeline tr.ownership-change.kind-lease_taken_over')
    assert 'from another-host.invalid pid 4242 at epoch 1' in over.text
    assert over.find_element(By.CSS_SELECTOR, '.badge.takeover').text == 'taken over'
    step = browser.find_element(By.CSS_SELECTOR, 'table.timeline tr.kind-run_started')
    taken = browser.find_element(By.CSS_SELECTOR, 'table.timeline tr.ownership-change.kind-lease_taken')
    assert taken.value_of_css_property('background-color') != step.value_of_css_property('background-color')
    shoot('ownership-4-timeline')
