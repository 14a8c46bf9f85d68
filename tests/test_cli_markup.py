"""Stored text is printed as written: square brackets and colons in it are never read as rich markup or emoji codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from typer.testing import CliRunner

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence, annotate_tool_effect
from stepcore.cli import app
from stepcore.cli._loop import run_coroutine

RUN = '[bold]run[/bold]'
AGENT = '[red]agent[/]'
CONVERSATION = '[i]talk[/i]'
TOOL = '[b]tool[/b]'
CALL = '[u]call[/u]'
KEY = '[dim]key[/dim]'
SUMMARY = 'sent [green]it[/green] :fire:'
ERROR = '[blink]down[/blink] :x:'

runner = CliRunner()


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart(TOOL, {}, tool_call_id=CALL)])
    return ModelResponse(parts=[TextPart('done')])


async def _record_run(database: Path) -> None:
    store = SqliteStepStore(database=database)

    agent = Agent(FunctionModel(_model), name=AGENT, capabilities=[StepPersistence(store=store)])

    @agent.tool(name=TOOL)
    async def send(ctx: RunContext[Any]) -> str:  # pyright: ignore[reportUnusedFunction]
        await annotate_tool_effect(store, ctx, idempotency_key=KEY, effect_summary=SUMMARY)
        raise RuntimeError(ERROR)

    try:
        with pytest.raises(RuntimeError, match='down'):
            await agent.run('go', run_id=RUN, conversation_id=CONVERSATION)
    finally:
        await store.aclose()


@pytest.fixture(scope='module')
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp('markup') / 'runs.db'
    run_coroutine(_record_run(path))
    return f'sqlite:///{path}'


def ok(*args: str) -> str:
    # Wide, so no table cell is folded in the middle of the text looked for.
    result: Any = runner.invoke(app, list(args), env={'COLUMNS': '250'})
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def test_runs_shows_ids_and_names_as_stored(db: str) -> None:
    text = ok('runs', '--store', db)
    for stored in (RUN, AGENT, CONVERSATION):
        assert stored in text


def test_effects_shows_the_ledger_as_stored(db: str) -> None:
    text = ok('effects', RUN, '--store', db)
    assert f'tool effects of {RUN}' in text
    for stored in (CALL, TOOL, KEY, SUMMARY, ERROR):
        assert stored in text
    assert f'run {RUN} has no unresolved tool effects' in ok('effects', RUN, '--unresolved', '--store', db)


def test_events_tree_snapshots_and_show_name_the_run_as_stored(db: str) -> None:
    events = ok('events', RUN, '--store', db)
    assert f'events of {RUN}' in events
    for stored in (TOOL, CALL, ERROR):
        assert stored in events
    tree = ok('tree', RUN, '--store', db)
    assert RUN in tree
    assert f'[{AGENT}]' in tree
    assert f'snapshots of {RUN}' in ok('snapshots', RUN, '--store', db)
    assert f'{RUN}  snapshot seq' in ok('show', RUN, '--store', db)


def test_an_error_naming_a_run_shows_it_as_given(db: str) -> None:
    result: Any = runner.invoke(app, ['show', '[x]gone', '--store', db])
    assert result.exit_code == 1
    assert "run '[x]gone' not found" in result.stderr
