"""Paging, delete_conversation and prune over runs written by real agents, and `stepcore prune`.

The kit (`stepcore_conformance.paging`, `.lifecycle`) checks the rules on every store with
records written directly; these tests drive a real `Agent` through `StepPersistence` on SQLite
and the CLI over the same files.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from typer.testing import CliRunner

from step_sqlite import SqliteStepStore
from stepcore import EventKind, RunRecord, StepEvent, StepPersistence, continue_run
from stepcore.cli import app
from stepcore.cli._loop import run_coroutine
from stepcore.store.lifecycle import parse_duration
from stepcore.store.models import utcnow

runner = CliRunner()


def _lookup_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart('lookup', {'key': 'a'}, tool_call_id='call-1')])
    return ModelResponse(parts=[TextPart('found it')])


def _agent(store: SqliteStepStore, name: str) -> Agent[None, str]:
    agent = Agent(FunctionModel(_lookup_then_answer), name=name, capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def lookup(key: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'value of {key}'

    return agent


async def test_pages_of_agent_runs_follow_the_cursor(tmp_path: Path) -> None:
    async with SqliteStepStore(database=tmp_path / 'runs.db') as store:
        agent = _agent(store, 'pager')
        for n in range(5):
            await agent.run('look it up', run_id=f'run-{n}', conversation_id='paged')
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = await store.list_runs_page(conversation_id='paged', limit=2, cursor=cursor)
            seen.extend(r.run_id for r in page.runs)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == [f'run-{n}' for n in range(5)]
        assert [r.run_id for r in await store.list_runs(status='completed', newest_first=True, limit=2)] == [
            'run-4',
            'run-3',
        ]
        assert [r.run_id for r in await store.list_runs(agent_name='pager', status='unfinished')] == []


async def test_prune_removes_finished_agent_runs_with_all_they_wrote(tmp_path: Path) -> None:
    async with SqliteStepStore(database=tmp_path / 'runs.db') as store:
        agent = _agent(store, 'pruned')
        await agent.run('look it up', run_id='old-1', conversation_id='pruning')
        await agent.run('look it up', run_id='old-2', conversation_id='pruning')
        await agent.run('look it up', run_id='other', conversation_id='elsewhere')
        events = [len(await store.list_events(r)) for r in ('old-1', 'old-2')]
        snapshots = [len(await store.list_snapshots(r, include_interrupted=True)) for r in ('old-1', 'old-2')]
        # idle for longer than a microsecond: every run written above has finished
        dry = await store.prune(timedelta(microseconds=1), conversation_id='pruning', dry_run=True)
        assert dry.runs == ['old-1', 'old-2']
        assert (dry.events, dry.snapshots, dry.ledger_entries) == (sum(events), sum(snapshots), 2)
        assert await store.get_run('old-1') is not None
        report = await store.prune(timedelta(microseconds=1), conversation_id='pruning')
        assert (report.runs, report.events, report.snapshots) == (dry.runs, dry.events, dry.snapshots)
        assert [r.run_id for r in await store.list_runs()] == ['other']
        with pytest.raises(LookupError):
            await continue_run(store, run_id='old-1')


async def test_delete_conversation_takes_the_delegates_of_an_agent_run(tmp_path: Path) -> None:
    async with SqliteStepStore(database=tmp_path / 'runs.db') as store:
        agent = _agent(store, 'boss')
        await agent.run('look it up', run_id='boss-run', conversation_id='team')
        # delegates name the run that started them, as a delegating agent's records do
        await store.register_run(RunRecord(run_id='boss-run.delegate', parent_run_id='boss-run'))
        await store.register_run(RunRecord(run_id='boss-run.delegate.sub', parent_run_id='boss-run.delegate'))
        await agent.run('look it up', run_id='bystander', conversation_id='other')
        assert await store.delete_conversation('team') == 1
        assert await store.get_run('boss-run.delegate') is not None
        await agent.run('look it up again', run_id='boss-run-2', conversation_id='team')
        await store.register_run(RunRecord(run_id='boss-run-2.delegate', parent_run_id='boss-run-2'))
        assert await store.delete_conversation('team', include_delegates=True) == 2
        left = {r.run_id for r in await store.list_runs()}
        assert left == {'boss-run.delegate', 'boss-run.delegate.sub', 'bystander'}
        assert await store.list_events('boss-run-2') == []


@pytest.mark.parametrize(
    ('text', 'expected'),
    [
        ('30d', timedelta(days=30)),
        ('12h', timedelta(hours=12)),
        ('90m', timedelta(minutes=90)),
        ('2w', timedelta(weeks=2)),
        ('45s', timedelta(seconds=45)),
        ('1d12h', timedelta(days=1, hours=12)),
        (' 7D ', timedelta(days=7)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize('text', ['', '30', 'd', '30x', '-3d', '1.5d', '0d', 'thirty days', '3d junk'])
def test_bad_durations_are_refused_naming_them(text: str) -> None:
    with pytest.raises(ValueError, match=r'duration|older_than') as caught:
        parse_duration(text)
    assert repr(text) in str(caught.value)


async def _aged_store(path: Path) -> None:
    """Three runs: idle for 40 days, started 40 days ago but written yesterday, started yesterday."""
    async with SqliteStepStore(database=path) as store:
        old = utcnow() - timedelta(days=40)
        for run_id in ('idle', 'long-running'):
            await store.register_run(RunRecord(run_id=run_id, started_at=old))
            await store.append_event(StepEvent(run_id=run_id, kind=EventKind.RUN_STARTED, timestamp=old, step_index=0))
        await store.append_event(
            StepEvent(
                run_id='long-running',
                kind=EventKind.MODEL_REQUEST_STARTED,
                timestamp=utcnow() - timedelta(1),
                step_index=0,
            )
        )
        await store.register_run(RunRecord(run_id='recent', started_at=utcnow() - timedelta(days=1)))


def _cli(*args: str) -> Any:
    return runner.invoke(app, list(args), env={'COLUMNS': '200'})


def test_cli_prune_dry_run_then_prune(tmp_path: Path) -> None:
    path = tmp_path / 'aged.db'
    run_coroutine(_aged_store(path))
    url = f'sqlite:///{path}'
    dry = _cli('prune', '--older-than', '30d', '--dry-run', '-s', url, '--json')
    assert dry.exit_code == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert (report['dry_run'], report['runs'], report['kept_active'], report['events']) == (
        True,
        ['idle'],
        ['long-running'],
        1,
    )
    text = _cli('prune', '--older-than', '30d', '-s', url)
    assert text.exit_code == 0, text.stderr
    assert 'removed' in text.stdout
    assert 'kept 1 run(s) that started before the cutoff but were written to since' in text.stdout
    listed = _cli('runs', '-s', url, '--json')
    assert [r['run_id'] for r in json.loads(listed.stdout)] == ['long-running', 'recent']


def test_cli_prune_refuses_a_bad_age(tmp_path: Path) -> None:
    result = _cli('prune', '--older-than', '30 days please', '-s', f'sqlite:///{tmp_path / "none.db"}')
    assert result.exit_code == 1
    assert "--older-than '30 days please' is not a duration" in result.stderr
    missing = _cli('prune', '-s', f'sqlite:///{tmp_path / "none.db"}')
    assert missing.exit_code != 0
