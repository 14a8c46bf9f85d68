"""The inspection commands over a real SQLite store filled by real agent runs.

The store is the demo's: an assistant run killed mid tool call (in a child process), its delegate,
the run resuming it (which settled the cut-short call in the killed run's ledger); plus a run
whose tool raised, added here.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from rich.console import Console
from typer.testing import CliRunner

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence
from stepcore.cli import app
from stepcore.cli._loop import run_coroutine
from stepcore.cli.demo import run_demo

runner = CliRunner()


def _failing_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart('deploy', {'service': 'web'}, tool_call_id='call-deploy')])
    return ModelResponse(parts=[TextPart('done')])


async def _add_failing_run(database: Path) -> None:
    store = SqliteStepStore(database=database)
    agent = Agent(FunctionModel(_failing_model), name='deployer', capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def deploy(service: str) -> str:  # pyright: ignore[reportUnusedFunction]
        raise RuntimeError(f'cluster unreachable while deploying {service}')

    try:
        with pytest.raises(RuntimeError, match='cluster unreachable'):
            await agent.run('deploy web', run_id='deploy-1', conversation_id='ops')
    finally:
        await store.aclose()


@pytest.fixture(scope='module')
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp('cli') / 'runs.db'
    run_demo(path, console=Console(file=io.StringIO()))
    run_coroutine(_add_failing_run(path))
    return f'sqlite:///{path}'


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    # A wide console, so table cells are not folded in the middle of the values the tests look for.
    return runner.invoke(app, list(args), env={'COLUMNS': '200', **(env or {})})


def ok(*args: str) -> str:
    result = cli(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def as_json(*args: str) -> Any:
    return json.loads(ok(*args, '--json'))


def test_runs_lists_every_run_oldest_first(db: str) -> None:
    rows = as_json('runs', '--store', db)
    assert [r['run_id'] for r in rows] == ['report-run-1', 'report-run-1.research', 'report-run-2', 'deploy-1']
    assert [r['status'] for r in rows] == ['unfinished', 'completed', 'completed', 'failed']
    # the killed run was resumed: its lease says so, and it is never offered for resuming again
    assert [r['ownership'] for r in rows] == ['resumed', None, None, None]
    assert rows[0]['standing'] == 'resumed by report-run-2 (completed)'
    text = ok('runs', '--store', db)
    assert 'report-run-1' in text
    assert 'resumed by report-run-2 (completed)' in text
    assert 'failed' in text


def test_runs_filters_combine(db: str) -> None:
    assert [r['run_id'] for r in as_json('runs', '-s', db, '--conversation', 'weekly-report')] == [
        'report-run-1',
        'report-run-2',
    ]
    assert [r['run_id'] for r in as_json('runs', '-s', db, '--parent', 'report-run-1')] == ['report-run-1.research']
    assert [r['run_id'] for r in as_json('runs', '-s', db, '--agent', 'assistant')] == ['report-run-1', 'report-run-2']
    assert as_json('runs', '-s', db, '--agent', 'assistant', '--conversation', 'ops') == []


def test_runs_pages_from_the_newest(db: str) -> None:
    assert [r['run_id'] for r in as_json('runs', '-s', db, '--limit', '2')] == ['report-run-2', 'deploy-1']
    assert [r['run_id'] for r in as_json('runs', '-s', db, '--limit', '2', '--offset', '2')] == [
        'report-run-1',
        'report-run-1.research',
    ]
    text = ok('runs', '-s', db, '--limit', '1')
    assert 'newest runs 1-1 shown' in text
    assert '--offset 1' in text
    last = ok('runs', '-s', db, '--limit', '2', '--offset', '2')
    assert 'newest runs 3-4 shown' in last
    assert '--offset' not in last


def test_runs_filter_by_status_and_start(db: str) -> None:
    assert [r['run_id'] for r in as_json('runs', '-s', db, '--status', 'failed')] == ['deploy-1']
    assert [r['run_id'] for r in as_json('runs', '-s', db, '--status', 'unfinished')] == ['report-run-1']
    assert len(as_json('runs', '-s', db, '--after', '1d')) == 4
    assert as_json('runs', '-s', db, '--before', '2000-01-01') == []
    assert ok('runs', '-s', db, '--before', '2000-01-01') == 'no runs match\n'
    result = cli('runs', '-s', db, '--after', 'last tuesday')
    assert result.exit_code == 1
    assert "--after 'last tuesday' is neither a date nor an age" in result.stderr
    result = cli('runs', '-s', db, '--status', 'done')
    assert result.exit_code == 1
    assert "status 'done' is not a run status: use one of completed, failed, unfinished" in result.stderr


def test_store_from_environment(db: str) -> None:
    result = cli('runs', '--json', env={'STEPCORE_STORE': db})
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)) == 4


def test_tree_shows_delegation_and_status(db: str) -> None:
    tree = as_json('tree', 'report-run-1', '-s', db)
    assert tree['status'] == 'unfinished'
    assert tree['unresolved_tool_effects'] == 0  # settled when the run was resumed
    assert [(c['run_id'], c['status'], c['children']) for c in tree['children']] == [
        ('report-run-1.research', 'completed', [])
    ]
    text = ok('tree', 'report-run-1', '-s', db)
    assert '└── report-run-1.research  [researcher]  completed' in text
    assert 'unresolved' not in text


def test_events_trail_ends_where_the_process_died(db: str) -> None:
    events = as_json('events', 'report-run-1', '-s', db)
    assert events[0]['kind'] == 'run_started'
    assert (events[-2]['kind'], events[-2]['tool_name']) == ('tool_call_started', 'send_email')
    # the process died there; resolving it on resume recorded how the call was settled
    assert (events[-1]['kind'], events[-1]['tool_name']) == ('tool_call_completed', 'send_email')
    assert events[-1]['metadata']['stepcore.settled_by'] == 'reconciled'
    failed = as_json('events', 'deploy-1', '-s', db)
    assert failed[-1]['kind'] == 'run_failed'
    assert any('cluster unreachable' in (e['error'] or '') for e in failed)
    text = ok('events', 'deploy-1', '-s', db)
    assert 'tool_call_failed' in text
    assert 'cluster unreachable' in text


def test_snapshots_and_show(db: str) -> None:
    snaps = as_json('snapshots', 'report-run-1', '-s', db)
    assert [(s['state'], s['message_count']) for s in snaps] == [('complete', 3), ('complete', 5)]
    text = ok('show', 'report-run-1', '-s', db)
    assert 'Prepare the weekly report' in text
    assert 'ask_researcher({"question": "What happened this week?"})' in text
    assert 'tool return' in text
    assert 'wrote weekly-report.md' in text
    first = snaps[0]['seq']
    earlier = ok('show', 'report-run-1', '--seq', str(first), '-s', db)
    assert f'snapshot seq {first}' in earlier
    assert 'write_report' not in earlier
    shown = as_json('show', 'report-run-1', '-s', db)
    assert len(shown['messages']) == 5
    assert shown['messages'][0]['parts'][0]['content'] == 'Prepare the weekly report and email it to the team.'


def test_show_failed_run_has_interrupted_or_complete_snapshot(db: str) -> None:
    shown = as_json('show', 'deploy-1', '-s', db)
    assert shown['state'] in ('complete', 'interrupted')
    assert 'deploy' in ok('show', 'deploy-1', '-s', db)


def test_effects_and_unresolved(db: str) -> None:
    effects = as_json('effects', 'report-run-1', '-s', db)
    assert [(e['tool_name'], e['status']) for e in effects] == [
        ('ask_researcher', 'completed'),
        ('write_report', 'completed'),
        ('send_email', 'completed'),
    ]
    assert effects[-1]['idempotency_key'] == 'email::team@example.com::weekly-report'
    assert effects[-1]['effect_summary'].endswith('[settled on recovery: reconciled]')
    assert 'no unresolved tool effects' in ok('effects', 'report-run-1', '--unresolved', '-s', db)
    assert 'no unresolved tool effects' in ok('effects', 'report-run-2', '--unresolved', '-s', db)
    failed = as_json('effects', 'deploy-1', '-s', db)
    assert [(e['tool_name'], e['status']) for e in failed] == [('deploy', 'failed')]


def test_effects_table_shows_how_a_call_was_settled_on_recovery(db: str) -> None:
    # the suffix is part of the stored summary, in square brackets: shown as written, not read as markup
    text = ok('effects', 'report-run-1', '--store', db)
    assert "email 'Weekly report' to team@example.com [settled on recovery: reconciled]" in text


def test_recover_explains_in_words(db: str) -> None:
    text = ' '.join(ok('recover', 'report-run-1', '-s', db).split())
    assert 'Resumed by report-run-2 (completed): a resumed run is never resumed again' in text
    assert 'Nothing left to do' in text
    assert 'resolve_run' not in text
    text = ' '.join(ok('recover', 'deploy-1', '-s', db).split())
    assert "No settled snapshot, but the store kept the run's start point" in text
    assert 'Tools with failed calls (may have made partial changes): deploy.' in text
    assert 'Next: `stepcore resume deploy-1 --agent MODULE:ATTR` to resume it from its start point.' in text
    assert 'resolve_run' not in text
    report = as_json('recover', 'report-run-1', '-s', db)
    assert report['resumed_by'] == ['report-run-2']
    assert report['newest_status'] == 'completed'
    assert report['lease']['state'] == 'resumed'
    assert report['lease']['resumed_by'] == 'report-run-2'
    assert report['settled_snapshot']['message_count'] == 5
    assert report['unresolved_effects'] == []
    # its result is in report-run-2, not here: continuing report-run-1 as is would send it again
    assert report['settled_on_recovery'] == ['call-email']
    assert report['continuable_as_is'] is False
    assert report['completed_tools'] == ['ask_researcher', 'write_report', 'send_email']
    assert as_json('recover', 'deploy-1', '-s', db)['failed_tools'] == ['deploy']


def _without_seq(doc: dict[str, Any]) -> dict[str, Any]:
    """The export minus store-assigned positions (a target store numbers records afresh, in the same order)."""
    copy = json.loads(json.dumps(doc))
    for run in copy['runs']:
        for item in (*run['events'], *run['snapshots']):
            item.pop('seq', None)
    return copy


def test_export_import_round_trip(db: str, tmp_path: Path) -> None:
    exported = tmp_path / 'export.json'
    ok('export', 'report-run-1', '--with-delegates', '-s', db, '-o', str(exported))
    doc = json.loads(exported.read_text())
    assert [r['run']['run_id'] for r in doc['runs']] == ['report-run-1', 'report-run-1.research']
    assert len(doc['runs'][0]['snapshots']) == 2

    target = f'sqlite:///{tmp_path / "copy.db"}'
    result = cli('import', str(exported), '-s', target)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == 'imported 2 run(s): report-run-1, report-run-1.research\n'  # no progress bar off a terminal
    again = json.loads(ok('export', 'report-run-1', '--with-delegates', '-s', target))
    assert _without_seq(again) == _without_seq(doc)
    # the copy answers the same questions as the original
    assert as_json('effects', 'report-run-1', '--unresolved', '-s', target) == as_json(
        'effects', 'report-run-1', '--unresolved', '-s', db
    )
    assert (
        as_json('show', 'report-run-1', '-s', target)['messages']
        == as_json('show', 'report-run-1', '-s', db)['messages']
    )

    # into another backend, from stdin
    folder = tmp_path / 'runs'
    result = runner.invoke(app, ['import', '-', '-s', f'file://{folder}'], input=exported.read_text(), env={})
    assert result.exit_code == 0, result.stderr
    assert _without_seq(json.loads(ok('export', 'report-run-1', '--with-delegates', '-s', f'file://{folder}'))) == (
        _without_seq(doc)
    )

    # importing the same runs twice is refused, and nothing is half written
    result = cli('import', str(exported), '-s', target)
    assert result.exit_code == 1
    assert "run 'report-run-1' already exists" in result.stderr


def test_import_rejects_bad_files(tmp_path: Path) -> None:
    target = f'sqlite:///{tmp_path / "t.db"}'
    bad = tmp_path / 'bad.json'
    bad.write_text('{"hello": 1}')
    result = cli('import', str(bad), '-s', target)
    assert result.exit_code == 1
    assert 'not a stepcore export' in result.stderr
    newer = tmp_path / 'newer.json'
    newer.write_text('{"stepcore_export": 99, "runs": []}')
    result = cli('import', str(newer), '-s', target)
    assert result.exit_code == 1
    assert 'export version 99 is newer' in result.stderr
    result = cli('import', str(tmp_path / 'absent.json'), '-s', target)
    assert result.exit_code == 1
    assert 'cannot read' in result.stderr


@pytest.mark.parametrize(
    ('args', 'message'),
    [
        (['show', 'no-such-run'], "run 'no-such-run' not found in this store"),
        (['events', 'no-such-run'], "run 'no-such-run' not found"),
        (['tree', 'no-such-run'], "run 'no-such-run' not found"),
        (['export', 'no-such-run'], "run 'no-such-run' not found"),
        (['show', 'report-run-1', '--seq', '999'], 'has no snapshot with seq 999; retained seqs:'),
    ],
)
def test_missing_run_is_one_line_and_exit_1(db: str, args: list[str], message: str) -> None:
    result = cli(*args, '-s', db)
    assert result.exit_code == 1
    assert message in result.stderr
    assert 'Traceback' not in result.stderr + result.stdout
    assert result.stderr.count('\n') == 1


def test_store_url_errors(tmp_path: Path) -> None:
    result = cli('runs', '-s', 'nosuch://x')
    assert result.exit_code == 1
    assert "unknown store URL scheme 'nosuch'" in result.stderr
    assert 'Installed step-store backends:' in result.stderr
    assert 'sqlite' in result.stderr

    result = cli('runs', '-s', 'memory://')
    assert result.exit_code == 1
    assert 'memory:// cannot be inspected' in result.stderr

    result = cli('runs', '-s', f'sqlite:///{tmp_path / "absent.db"}')
    assert result.exit_code == 1
    assert 'does not exist' in result.stderr
    assert not (tmp_path / 'absent.db').exists()

    garbage = tmp_path / 'garbage.db'
    garbage.write_text('this is not a database at all')
    result = cli('runs', '-s', f'sqlite:///{garbage}')
    assert result.exit_code == 1
    assert 'is not a SQLite database' in result.stderr

    result = cli('runs', '-s', f'sqlite:///{tmp_path}')
    assert result.exit_code == 1
    assert 'is a folder, not a SQLite database file' in result.stderr
    result = cli('runs', '-s', f'file://{garbage}')
    assert result.exit_code == 1
    assert 'is a file, not a folder of runs' in result.stderr

    result = cli('runs', env={'STEPCORE_STORE': ''})
    assert result.exit_code == 1
    assert 'pass --store URL or set STEPCORE_STORE' in result.stderr
    assert 'Traceback' not in result.stderr


def test_a_run_with_a_lease_and_no_record_is_listed_by_its_lease(tmp_path: Path) -> None:
    from stepcore.ownership.claims import open_lease
    from stepcore.store.leases import Owner

    database = tmp_path / 'lease-only.db'

    async def stopped_before_registering() -> None:
        store = SqliteStepStore(database=str(database))
        try:
            gone = Owner(host='another-host.invalid', pid=4242, token='t')
            await open_lease(store, 'half-started', ttl=0.0, owner=gone, resumes='the-run-it-resumes')
        finally:
            await store.aclose()

    run_coroutine(stopped_before_registering())
    url = f'sqlite:///{database}'
    (listed,) = as_json('runs', '-s', url, '--status', 'orphaned')
    assert listed['run_id'] == 'half-started'
    assert listed['ownership'] == 'orphaned'
    assert 'no run record' in listed['metadata']['stepcore.lease_only']
    assert 'it resumes run the-run-it-resumes' in listed['metadata']['stepcore.lease_only']
    assert as_json('runs', '-s', url, '--status', 'orphaned', '--agent', 'anyone') == []
