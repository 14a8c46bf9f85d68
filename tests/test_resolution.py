"""`resolve_run` after a real SIGKILL inside a tool: policies, settlements in the ledger, the CLI.

A child process runs an agent on a SQLite store whose `append_note` tool appends a line to a file
and then hangs; the test kills it with SIGKILL and resumes in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from typer.testing import CliRunner

from step_sqlite import SqliteStepStore
from stepcore import (
    Reconciled,
    StepPersistence,
    ToolEffectRecord,
    ToolEffectStatus,
    annotate_tool_effect,
    inspect_recovery,
    mark_checked,
    recovery_policy,
    resolve_run,
    supply_result,
)
from stepcore.cli import app
from stepcore.recovery.policies import RecoveryPolicy

CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from step_sqlite import SqliteStepStore
    from stepcore import StepPersistence, annotate_tool_effect

    def model(messages, info):
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[ToolCallPart('read_notes', {}, tool_call_id='call-0')])
        return ModelResponse(parts=[ToolCallPart('append_note', {'text': 'call ana'}, tool_call_id='call-1')])

    store = SqliteStepStore(database=sys.argv[1])
    agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, run_id='notes-1')])
    notes = Path(sys.argv[2])

    @agent.tool_plain
    def read_notes() -> str:
        return 'no notes yet'

    @agent.tool
    async def append_note(ctx: RunContext[None], text: str) -> str:
        await annotate_tool_effect(store, ctx, idempotency_key=f'note::{text}', effect_summary=f'append {text!r}')
        with notes.open('a') as f:
            f.write(f'note::{text}\\n')
        Path(sys.argv[3]).touch()
        time.sleep(600)
        return 'noted'

    asyncio.run(agent.run('note: call ana'))
    """
)


def _returned(messages: list[ModelMessage]) -> set[str]:
    return {p.tool_call_id for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = _returned(messages)
    if 'call-1' in returned:
        return ModelResponse(parts=[TextPart('noted')])
    if 'call-0' not in returned:
        return ModelResponse(parts=[ToolCallPart('read_notes', {}, tool_call_id='call-0')])
    return ModelResponse(parts=[ToolCallPart('append_note', {'text': 'call ana'}, tool_call_id='call-1')])


@pytest.fixture(scope='module')
def killed_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a SQLite database holding run `notes-1`, killed inside `append_note` after its note was written."""
    folder = tmp_path_factory.mktemp('killed')
    database, notes, reached = folder / 'runs.db', folder / 'notes.txt', folder / 'reached'
    child = subprocess.Popen([sys.executable, '-c', CHILD, str(database), str(notes), str(reached)])
    try:
        deadline = time.monotonic() + 60
        while not reached.exists():
            assert child.poll() is None, f'the agent process ended early with status {child.returncode}'
            assert time.monotonic() < deadline, 'the agent process never reached append_note'
            time.sleep(0.02)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
    return folder


@pytest.fixture
def killed(killed_once: Path, tmp_path: Path) -> tuple[Path, Path]:
    """This test's copy of what the killed process left: the database (with its journal) and the notes."""
    for file in killed_once.iterdir():
        shutil.copy2(file, tmp_path / file.name)
    return tmp_path / 'runs.db', tmp_path / 'notes.txt'


def notes_agent(store: SqliteStepStore, notes: Path, run_id: str, policy: RecoveryPolicy | None) -> Agent[None, str]:
    agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, run_id=run_id)])

    @agent.tool_plain
    def read_notes() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'no notes yet'

    async def append_note(ctx: RunContext[None], text: str) -> str:
        await annotate_tool_effect(store, ctx, idempotency_key=f'note::{text}', effect_summary=f'append {text!r}')
        with notes.open('a') as file:
            file.write(f'note::{text}\n')
        return 'noted'

    agent.tool(recovery_policy(policy)(append_note) if policy is not None else append_note)
    return agent


def note_written(notes: Path) -> Any:
    def check(entry: ToolEffectRecord) -> Reconciled | None:
        line = f'note::{entry.args["text"]}'
        return Reconciled('noted (found after the crash)') if line in notes.read_text().splitlines() else None

    return check


async def test_after_a_kill_the_report_tells_the_cut_short_call_and_that_continuing_is_unsafe(
    killed: tuple[Path, Path],
) -> None:
    database, _ = killed
    async with SqliteStepStore(database=database) as store:
        report = await inspect_recovery(store=store, run_id='notes-1')
    assert not report.interrupted  # no newer snapshot: the kill left the call in the ledger only
    assert not report.continuable_as_is
    [entry] = report.unresolved
    assert (entry.tool_name, entry.args, entry.idempotency_key) == (
        'append_note',
        {'text': 'call ana'},
        'note::call ana',
    )


async def test_a_reconcile_function_finds_the_effect_and_the_run_resumes_without_repeating_it(
    killed: tuple[Path, Path],
) -> None:
    database, notes = killed
    async with SqliteStepStore(database=database) as store:
        agent = notes_agent(store, notes, 'notes-2', note_written(notes))
        resumption = await resolve_run(store, run_id='notes-1', agent=agent)
        assert resumption.ready
        assert [(s.tool_call_id, s.how, s.result) for s in resumption.settled] == [
            ('call-1', 'reconciled', 'noted (found after the crash)')
        ]
        result = await resumption.run(agent)
        assert result.output == 'noted'
        assert notes.read_text().splitlines() == ['note::call ana']
        entry = await store.get_tool_effect(run_id='notes-1', tool_call_id='call-1')
        assert entry is not None
        assert entry.status is ToolEffectStatus.COMPLETED
        assert entry.effect_summary == "append 'call ana' [settled on recovery: reconciled]"
        assert await store.list_unresolved_tool_effects(run_id='notes-1') == []
        report = await inspect_recovery(store=store, run_id='notes-2')
        assert report.continuable_as_is
        resumed = await store.get_run(run_id='notes-2')
        assert resumed is not None
        assert resumed.metadata == {'stepcore.resumes': 'notes-1'}
        [event] = [e for e in await store.list_events(run_id='notes-1') if e.metadata.get('stepcore.settled_by')]
        assert event.metadata['stepcore.result'] == '"noted (found after the crash)"'


async def test_a_reconcile_function_that_finds_nothing_runs_the_call(killed: tuple[Path, Path]) -> None:
    database, notes = killed
    notes.write_text('')  # as if the kill had come before the write
    async with SqliteStepStore(database=database) as store:
        agent = notes_agent(store, notes, 'notes-2', note_written(notes))
        resumption = await resolve_run(store, run_id='notes-1', agent=agent)
        assert [s.how for s in resumption.settled] == ['rerun']
        assert resumption.deferred_tool_results is not None
        assert resumption.deferred_tool_results.approvals == {'call-1': True}
        await resumption.run(agent)
    assert notes.read_text().splitlines() == ['note::call ana']


async def test_rerun_passes_the_same_arguments_again(killed: tuple[Path, Path]) -> None:
    database, notes = killed
    async with SqliteStepStore(database=database) as store:
        agent = notes_agent(store, notes, 'notes-2', 'rerun')
        resumption = await resolve_run(store, run_id='notes-1', agent=agent)
        await resumption.run(agent)
        [entry] = [e for e in await store.list_tool_effects(run_id='notes-2') if e.tool_call_id == 'call-1']
        assert (entry.args, entry.idempotency_key) == ({'text': 'call ana'}, 'note::call ana')
    # No deduplication in this tool: 'rerun' was the wrong policy for it, and the note is there twice.
    assert notes.read_text().splitlines() == ['note::call ana', 'note::call ana']


async def test_an_ask_call_waits_for_the_caller_who_supplies_its_result(killed: tuple[Path, Path]) -> None:
    database, notes = killed
    async with SqliteStepStore(database=database) as store:
        agent = notes_agent(store, notes, 'notes-2', None)
        resumption = await resolve_run(store, run_id='notes-1', agent=agent)
        assert not resumption.ready
        assert [e.tool_call_id for e in resumption.pending] == ['call-1']
        with pytest.raises(RuntimeError, match=r"append_note \(call-1\) args=\{'text': 'call ana'\}"):
            await resumption.run(agent)
        await supply_result(store, run_id='notes-1', tool_call_id='call-1', result={'noted': True})
        resumption = await resolve_run(store, run_id='notes-1', agent=agent)
        assert [(s.how, s.result) for s in resumption.settled] == [('supplied', {'noted': True})]
        await resumption.run(agent)
    assert notes.read_text().splitlines() == ['note::call ana']


async def test_policies_given_by_name_override_the_tools_own(killed: tuple[Path, Path]) -> None:
    database, notes = killed
    async with SqliteStepStore(database=database) as store:
        agent = notes_agent(store, notes, 'notes-2', 'rerun')
        resumption = await resolve_run(store, run_id='notes-1', agent=agent, policies={'append_note': 'ask'})
        assert [e.tool_call_id for e in resumption.pending] == ['call-1']
        with pytest.raises(ValueError, match="recovery policy for tool 'append_note' must be"):
            await resolve_run(store, run_id='notes-1', agent=agent, policies={'append_note': 'maybe'})  # pyright: ignore[reportArgumentType]


async def test_a_call_marked_checked_resumes_with_the_note_as_its_result(killed: tuple[Path, Path]) -> None:
    database, notes = killed
    async with SqliteStepStore(database=database) as store:
        await mark_checked(store, run_id='notes-1', tool_call_id='call-1', note='already in the notes')
        agent = notes_agent(store, notes, 'notes-2', None)
        resumption = await resolve_run(store, run_id='notes-1', agent=agent)
        result = await resumption.run(agent)
        returns = [p.content for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
        assert returns == ['no notes yet', 'already in the notes']
        with pytest.raises(
            LookupError,
            match=r"run 'notes-2' \(the newest continuation of 'notes-1'\) has no ledger entry for tool call 'nope'",
        ):
            await mark_checked(store, run_id='notes-1', tool_call_id='nope')


def test_cli_recover_shows_the_arguments_and_settles_calls(killed: tuple[Path, Path]) -> None:
    database, _ = killed
    runner = CliRunner()
    url = f'sqlite:///{database}'
    shown = runner.invoke(app, ['recover', 'notes-1', '--store', url])
    assert shown.exit_code == 0, shown.output
    text = ' '.join(shown.output.split())
    assert 'append_note (call-1) started, args {"text": "call ana"}' in text
    assert 'cannot be continued as is' in text
    reported = json.loads(runner.invoke(app, ['recover', 'notes-1', '--store', url, '--json']).output)
    assert reported['continuable_as_is'] is False
    settled = runner.invoke(app, ['recover', 'notes-1', '--store', url, '--supply', 'call-1={"noted": true}', '--json'])
    assert settled.exit_code == 0, settled.output
    after = json.loads(settled.output)
    assert after['unresolved_effects'] == []
    assert after['settled_on_recovery'] == ['call-1']
    assert after['continuable_as_is'] is False  # its result is for resolve_run to hand over
    bad = runner.invoke(app, ['recover', 'notes-1', '--store', url, '--supply', 'call-1'])
    assert bad.exit_code != 0
    assert 'is not CALL=RESULT' in bad.output
    missing = runner.invoke(app, ['recover', 'notes-1', '--store', url, '--mark-checked', 'call-9'])
    assert missing.exit_code != 0
    assert "no ledger entry for tool call 'call-9'" in missing.output


async def test_a_refused_settlement_changes_nothing_not_even_the_lease_epoch(killed: tuple[Path, Path]) -> None:
    database, _ = killed
    async with SqliteStepStore(database=database) as store:
        before = await store.get_lease('notes-1')
        for attempt in range(2):
            with pytest.raises(LookupError, match="no ledger entry for tool call 'nonexistent'"):
                await supply_result(store, run_id='notes-1', tool_call_id='nonexistent', result=attempt)
        after = await store.get_lease('notes-1')
        assert before is not None
        assert after is not None
        assert (after.epoch, after.state, after.owner) == (before.epoch, before.state, before.owner)
