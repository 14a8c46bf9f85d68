"""Every table of the command line fits a terminal 80 columns wide without losing what it shows.

Cells wrap (a moment goes to two lines, date above time; an id folds) instead of being cut short with
an ellipsis, and a table too wide for its columns moves some of them under another (a run's
conversation and parent under its id, a call's id under its tool, a backend's features under its
summary). The store is a real SQLite file filled by real pydantic-ai agents with `StepPersistence`.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

import stepcore
from stepcore import StepPersistence
from stepcore.cli import app
from stepcore.cli.fitting import fit

ERROR = 'cluster unreachable while deploying the web frontend service to production'


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart('done')])
    return ModelResponse(
        parts=[ToolCallPart('lookup_customer_records', {'customer': 'acme'}, tool_call_id='call-lookup-customer')]
    )


async def _fill(url: str) -> None:
    store = stepcore.open_store(url, must_exist=False)
    try:
        persistence = StepPersistence(store=store, answer_within=timedelta(hours=1))
        agent = Agent(
            FunctionModel(_model), name='customer-records-assistant', capabilities=[persistence], output_type=[str]
        )

        @agent.tool_plain
        def lookup_customer_records(customer: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return f'{customer}: 3 records'

        await agent.run('look them up', run_id='report-7')

        failing = Agent(FunctionModel(_model), name='deployer', capabilities=[StepPersistence(store=store)])

        @failing.tool_plain(name='lookup_customer_records')
        def broken(customer: str) -> str:  # pyright: ignore[reportUnusedFunction]
            raise RuntimeError(ERROR)

        with pytest.raises(RuntimeError):
            await failing.run('deploy', run_id='deploy-9', conversation_id='release-2026-12-week-49-frontend')

        asking = Agent(
            FunctionModel(_model), name='approver', capabilities=[persistence], output_type=[str, DeferredToolRequests]
        )

        @asking.tool_plain(requires_approval=True, name='lookup_customer_records')
        def guarded(customer: str) -> str:  # pyright: ignore[reportUnusedFunction]
            return customer

        await asking.run('ask first', run_id='approve-3')
    finally:
        await store.aclose()


@pytest.fixture(scope='module')
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    made = f'sqlite:///{tmp_path_factory.mktemp("columns") / "runs.db"}'
    asyncio.run(_fill(made))
    return made


def at_80(*args: str) -> str:
    result: Any = CliRunner().invoke(app, list(args), env={'COLUMNS': '80'})
    assert result.exit_code == 0, (result.stdout, result.stderr)
    text: str = result.stdout
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert not too_wide, '\n'.join(too_wide)
    assert '…' not in text, text
    return text


def words(text: str) -> set[str]:
    """The words of a table, its borders left out, and each also without the quotes and brackets around it."""
    found = set(re.sub(r'[│┃┏┓┗┛┡┩└┘┌┐━─╇╋┳┻┼┬┴├┤]', ' ', text).split())
    return found | {piece for word in found for piece in re.split(r"[('\")]+", word) if piece}


def test_runs(url: str) -> None:
    text = at_80('runs', '-s', url)
    found = words(text)
    for word in ('report-7', 'deploy-9', 'approve-3', 'customer-records-assistant', 'deployer', 'approver'):
        assert word in found, word
    for word in ('completed', 'failed', 'waiting', 'answers', 'conversation'):
        assert word in found, word
    rows = json.loads(CliRunner().invoke(app, ['runs', '-s', url, '--json']).stdout)
    for row in rows:
        assert row['started_at'][:10] in found  # the date of each start, whole (its time below it)
        assert row['conversation_id'][:8] in text


def test_runs_waiting(url: str) -> None:
    text = at_80('runs', '-s', url, '--status', 'waiting')
    found = words(text)
    assert {'approve-3', 'approver', 'waiting', '1', 'call'} <= found
    [row] = json.loads(CliRunner().invoke(app, ['runs', '-s', url, '--status', 'waiting', '--json']).stdout)
    assert (row['waiting_calls'], row['unanswered_calls']) == (1, 1)
    deadline = row['next_deadline']
    assert deadline is not None
    assert deadline[:10] in found
    assert deadline[11:19] in found


def test_events(url: str) -> None:
    text = at_80('events', 'deploy-9', '-s', url)
    found = words(text)
    for word in ('run_started', 'model_request_completed', 'tool_call_started', 'tool_call_failed', 'run_failed'):
        assert word in found, word
    assert {'lookup_customer_records', 'call-lookup-customer'} <= found
    assert set(ERROR.split()) <= found  # the error, wrapped, every word of it


def test_effects_and_snapshots(url: str) -> None:
    found = words(at_80('effects', 'deploy-9', '-s', url))
    assert {'lookup_customer_records', 'call-lookup-customer', 'failed'} <= found
    assert set(ERROR.split()) <= found
    found = words(at_80('snapshots', 'report-7', '-s', url))
    assert {'complete', 'response:', 'text'} <= found


def test_job(url: str) -> None:
    text = at_80('job', 'report-7', '-s', url)
    found = words(text)
    assert {'report-7', 'completed', 'ended', '(completed)'} <= found
    assert 'job report-7 is completed' in text


def test_plugins_keeps_every_feature_and_url(url: str) -> None:
    del url
    text = at_80('plugins')
    found = words(text)
    rows = json.loads(CliRunner().invoke(app, ['plugins', '--json']).stdout)
    for row in rows:
        assert row['distribution'] in found
        for backend in row['backends']:
            assert backend['key'] in found
            for feature in backend['features']:
                assert feature in found or f'{feature},' in found, feature
            for scheme in backend['urls']:
                assert scheme in found, scheme
            for word in backend['summary'].split():
                assert word in found, word


def test_a_table_that_fits_is_left_as_it_is(url: str) -> None:
    wide: Any = CliRunner().invoke(app, ['events', 'report-7', '-s', url], env={'COLUMNS': '200'})
    assert wide.exit_code == 0
    header = next(line for line in wide.stdout.splitlines() if 'tool_call_id' in line)
    assert 'timestamp (UTC)' in header  # one line of headers, every column its own


def test_fit_cuts_nothing_a_word_needs() -> None:
    table = Table()
    table.add_column('id', overflow='fold')
    table.add_column('status', no_wrap=True)
    table.add_column('note')
    table.add_row('01a2507a-8d28-71ef-92a7-d2365a2eea04', 'completed', 'a note of several words ' * 5)
    written = io.StringIO()
    Console(width=60, file=written, color_system=None).print(fit(table, 60))
    out = written.getvalue()
    assert all(len(line) <= 60 for line in out.splitlines())
    assert '…' not in out
    assert 'completed' in out
