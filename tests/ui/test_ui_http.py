"""The inspector over HTTP: read-only, escaped, filtered and paged, with errors that say what to do.

Each test talks to `stepcore ui` running in a child process (see conftest.py).
"""

from __future__ import annotations

import re
import shutil
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart

from step_sqlite import SqliteStepStore
from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.cli._loop import run_coroutine
from stepcore.ui.middleware import SECURITY_HEADERS

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


async def _fill_many(database: Path) -> None:
    """60 runs over two agents and three conversations, one with 250 events, through the store API."""
    store = SqliteStepStore(database=database)
    try:
        await store.register_run(RunRecord(run_id='root', agent_name='planner', conversation_id='c0', started_at=T0))
        for i in range(59):
            await store.register_run(
                RunRecord(
                    run_id=f'job-{i:02d}',
                    agent_name='planner' if i % 2 else 'worker',
                    conversation_id=f'c{i % 3}',
                    parent_run_id='root' if i < 5 else None,
                    started_at=T0 + timedelta(minutes=i + 1),
                )
            )
        events = [StepEvent(run_id='root', kind=EventKind.RUN_STARTED, timestamp=T0, step_index=0)]
        for step in range(1, 63):
            at = T0 + timedelta(seconds=10 * step)
            call = f'call-{step}'
            events += [
                StepEvent(run_id='root', kind=EventKind.MODEL_REQUEST_STARTED, step_index=step, timestamp=at),
                StepEvent(
                    run_id='root',
                    kind=EventKind.MODEL_REQUEST_COMPLETED,
                    step_index=step,
                    timestamp=at + timedelta(milliseconds=250),
                ),
                StepEvent(
                    run_id='root',
                    kind=EventKind.TOOL_CALL_STARTED,
                    step_index=step,
                    tool_name='probe',
                    tool_call_id=call,
                    timestamp=at + timedelta(seconds=1),
                ),
                StepEvent(
                    run_id='root',
                    kind=EventKind.TOOL_CALL_COMPLETED,
                    step_index=step,
                    tool_name='probe',
                    tool_call_id=call,
                    timestamp=at + timedelta(seconds=2, milliseconds=500),
                ),
            ]
        events.append(
            StepEvent(run_id='root', kind=EventKind.RUN_COMPLETED, step_index=62, timestamp=T0 + timedelta(seconds=700))
        )
        await store.write_batch(events)
        for i in range(3):  # job-00 finished, job-01 failed, the others never ended
            kind = EventKind.RUN_COMPLETED if i == 0 else EventKind.RUN_STARTED
            await store.append_event(StepEvent(run_id=f'job-{i:02d}', kind=kind, step_index=0))
        await store.append_event(StepEvent(run_id='job-01', kind=EventKind.RUN_FAILED, error='boom', step_index=0))
        await store.record_tool_effect(
            ToolEffectRecord(run_id='job-02', tool_call_id='pay-1', tool_name='pay', status=ToolEffectStatus.STARTED)
        )
        # job-03: a history rewritten between two snapshots, as a compacting history processor does
        earlier = [_ask('plan the week'), _say('step 1'), _ask('and then?'), _say('step 2')]
        compacted = [_ask('summary: a plan was made'), _ask('and then?'), _say('step 2'), _say('step 3')]
        await store.save_snapshot(ContinuableSnapshot(run_id='job-03', step_index=2, messages=earlier))
        await store.save_snapshot(ContinuableSnapshot(run_id='job-03', step_index=3, messages=compacted))
        # then a crash in the middle of a tool call
        cut = [
            *compacted,
            ModelResponse(parts=[ToolCallPart('deploy', {'service': 'web'}, tool_call_id='call-deploy')]),
            ModelRequest(parts=[], state='interrupted'),
        ]
        await store.save_snapshot(
            ContinuableSnapshot(run_id='job-03', step_index=4, messages=cut, state=SnapshotState.INTERRUPTED)
        )
    finally:
        await store.aclose()


def _ask(text: str) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(text)])


def _say(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])


@pytest.fixture(scope='module')
def many_ui(tmp_path_factory: pytest.TempPathFactory, serve: Callable[..., Any]) -> Any:
    path = tmp_path_factory.mktemp('ui-many') / 'many.db'
    run_coroutine(_fill_many(path))
    return serve('--store', f'sqlite:///{path}')


def _run_ids(html: str) -> list[str]:
    return re.findall(r'<a class="run-id" href="/runs/[^"]+">([^<]+)</a>\s*</td>\s*<td>', html)


# -- read-only and safe -----------------------------------------------------------------------------


def test_only_get_is_answered(demo_ui: Any) -> None:
    for method in ('POST', 'PUT', 'DELETE', 'PATCH'):
        for path in ('/', '/runs/report-run-1', '/static/style.css'):
            page = demo_ui.get(path, method=method)
            assert page.status == 405, (method, path)
    refused = demo_ui.get('/runs/report-run-1', method='POST')
    assert 'read-only' in refused.text
    assert demo_ui.get('/', method='HEAD').status == 200


def test_every_response_carries_the_security_headers(demo_ui: Any) -> None:
    for path in ('/', '/runs/report-run-1', '/static/ui.js', '/runs/nope'):
        page = demo_ui.get(path)
        for name, value in SECURITY_HEADERS.items():
            assert page.header(name) == value, (path, name)
    assert "script-src 'self'" in SECURITY_HEADERS['content-security-policy']  # no inline script can run


def test_other_host_names_are_refused_on_loopback(demo_ui: Any) -> None:
    port = demo_ui.base.rsplit(':', 1)[1]
    refused = demo_ui.get('/', headers={'Host': f'attacker.example:{port}'})
    assert refused.status == 421
    assert 'attacker.example' in refused.text
    assert demo_ui.get('/', headers={'Host': f'localhost:{port}'}).status == 200


def test_stored_markup_is_escaped_in_the_html(hostile_ui: Any) -> None:
    overview = hostile_ui.get('/runs/hostile-1').text
    assert '&lt;i&gt;scraper&lt;/i&gt;' in overview
    assert '<i>scraper</i>' not in overview
    seq = max(int(s) for s in re.findall(r'/runs/hostile-1/snapshots/(\d+)"', overview))
    page = hostile_ui.get(f'/runs/hostile-1/snapshots/{seq}').text
    assert '&lt;script&gt;document.body.dataset.pwned' in page
    assert '<script>document' not in page
    assert 'onerror=&#34;document.body' in page or 'onerror=&quot;document.body' in page
    assert '&lt;/pre&gt;&lt;/div&gt;&lt;b&gt;not bold' in page
    assert '<b>' not in page
    # every script tag on the page is the app's own
    assert re.findall(r'<script[^>]*>', page) == ['<script src="/static/ui.js" defer>']


def test_media_are_served_from_the_snapshot_and_only_safe_types_inline(hostile_ui: Any) -> None:
    overview = hostile_ui.get('/runs/hostile-1').text
    seq = max(int(s) for s in re.findall(r'/runs/hostile-1/snapshots/(\d+)"', overview))
    page = hostile_ui.get(f'/runs/hostile-1/snapshots/{seq}').text
    links = re.findall(r'(/runs/hostile-1/snapshots/\d+/media/\d+/\d+/\d+)', page)
    assert len(set(links)) == 2
    png, svg = (hostile_ui.get(link) for link in sorted(set(links)))
    assert png.status == 200
    assert png.header('content-type') == 'image/png'
    assert png.body.startswith(b'\x89PNG')
    assert 'sandbox' in (png.header('content-security-policy') or '')
    assert svg.header('content-type') == 'application/octet-stream'
    assert (svg.header('content-disposition') or '').startswith('attachment')
    missing = hostile_ui.get(f'/runs/hostile-1/snapshots/{seq}/media/0/0/7')
    assert missing.status == 404
    assert 'has no media at 0/0/7' in missing.text


# -- finding runs -----------------------------------------------------------------------------------


def test_runs_are_paged_newest_first(many_ui: Any) -> None:
    first = many_ui.get('/').text
    assert '60 runs, newest first' in first
    ids = _run_ids(first)
    assert len(ids) == 50
    assert ids[0] == 'job-58'
    assert 'page 1 of 2' in first
    second = _run_ids(many_ui.get('/?page=2').text)
    assert second == [f'job-{i:02d}' for i in range(8, -1, -1)] + ['root']
    assert _run_ids(many_ui.get('/?page=99').text) == second  # past the end: the last page


def test_runs_filter_by_agent_conversation_parent_and_status(many_ui: Any) -> None:
    workers = _run_ids(many_ui.get('/?agent=worker').text)
    assert len(workers) == 30
    assert all(int(r.split('-')[1]) % 2 == 0 for r in workers)
    both = _run_ids(many_ui.get('/?agent=worker&conversation=c1').text)
    assert both == [f'job-{i:02d}' for i in range(58, -1, -1) if i % 2 == 0 and i % 3 == 1]
    assert _run_ids(many_ui.get('/?parent=root').text) == ['job-04', 'job-03', 'job-02', 'job-01', 'job-00']
    assert _run_ids(many_ui.get('/?status=completed').text) == ['job-00', 'root']
    assert _run_ids(many_ui.get('/?status=failed').text) == ['job-01']
    unfinished = many_ui.get('/?status=unfinished&parent=root').text
    assert _run_ids(unfinished) == ['job-04', 'job-03', 'job-02']
    assert '1 unresolved' in unfinished
    none = many_ui.get('/?agent=nobody').text
    assert 'No run matches these filters' in none


def test_find_a_run_by_the_start_of_its_id(many_ui: Any) -> None:
    several = many_ui.get('/?q=job-5').text
    assert _run_ids(several) == [f'job-{i}' for i in range(58, 49, -1)]
    one = many_ui.get('/?q=job-57')
    assert one.status == 303
    assert one.header('location') == '/runs/job-57'
    assert 'No run matches' in many_ui.get('/?q=zzz').text


def test_bad_query_values_say_what_to_use(many_ui: Any) -> None:
    bad = many_ui.get('/?status=done')
    assert bad.status == 400
    assert 'status=&#39;done&#39; is not one of completed, failed, unfinished' in bad.text
    page = many_ui.get('/?page=two')
    assert page.status == 400
    assert 'is not a whole number' in page.text


# -- a run --------------------------------------------------------------------------------------------


def test_timeline_pages_with_durations(many_ui: Any) -> None:
    first = many_ui.get('/runs/root/timeline').text
    assert '250 events over 11 min 40 s' in first
    seqs = [int(s) for s in re.findall(r'<tr class="[^"]*" id="e(\d+)">', first)]
    assert seqs == list(range(1, 101))
    assert '250.0 ms' in first  # model request 250 ms
    assert '1.50 s' in first  # tool call 1.5 s
    last = many_ui.get('/runs/root/timeline?page=3').text
    assert [int(s) for s in re.findall(r'id="e(\d+)"', last)] == list(range(201, 251))
    assert '11 min 40 s' in last  # the run, on its run_completed event
    assert 'no end' not in last
    assert '201-250 of 250 · page 3 of 3' in last


def test_run_overview_lineage_and_unresolved_ledger(many_ui: Any) -> None:
    root = many_ui.get('/runs/root').text
    tree = root[root.index('<ul class="tree">') : root.index('<h3>Conversation')]
    assert [m for m in re.findall(r'href="/runs/([^"]+)"', tree)] == [f'job-{i:02d}' for i in range(5)]
    child = many_ui.get('/runs/job-02').text
    assert 'href="/runs/root"' in child
    assert '<tr class="effect-started unresolved">' in child
    assert 'may or may not have run' in child
    assert 'No settled snapshot' in child
    assert 'class="snippet"' not in child  # no snapshot: no code to continue from


def test_snapshot_diff_after_a_history_rewrite(many_ui: Any) -> None:
    listing = many_ui.get('/runs/job-03/snapshots').text
    first, second, third = (int(s) for s in re.findall(r'/runs/job-03/snapshots/(\d+)"', listing))
    page = many_ui.get(f'/runs/job-03/snapshots/{second}').text
    assert f'Against snapshot {first}:</strong> 2 kept, 1 added, 1 changed, 1 removed.' in page
    removed = page[page.index('<details class="removed"') : page.index('</details>')]
    assert 'step 1' in removed
    assert 'plan the week' not in removed  # replaced in place: counted as changed, not removed
    marked = dict(re.findall(r'<article class="msg msg-\w+ change-(\w+)" id="m(\d+)">', page))
    assert marked == {'changed': '0', 'added': '3'}
    only = many_ui.get(f'/runs/job-03/snapshots/{second}?only=changes').text
    assert re.findall(r'<article [^>]* id="m(\d+)">', only.split('</details>')[1]) == ['0', '3']
    assert 'The first retained snapshot' in many_ui.get(f'/runs/job-03/snapshots/{first}').text
    assert listing.count('<span class="badge state-complete">complete</span>') == 2
    assert '<span class="badge state-interrupted">interrupted</span>' in listing
    assert f'<tr class="state-complete">\n    <td class="num"><a href="/runs/job-03/snapshots/{second}">' in listing
    assert '<span class="badge settled">settled</span>' in listing
    cut = many_ui.get(f'/runs/job-03/snapshots/{third}').text
    assert 'holds tool calls without results' in cut
    assert 'interrupted request' in cut
    assert '2 added' in cut
    assert '&#34;service&#34;: &#34;web&#34;' in cut or '&quot;service&quot;: &quot;web&quot;' in cut


def test_missing_things_are_named(many_ui: Any) -> None:
    run = many_ui.get('/runs/nope')
    assert run.status == 404
    assert 'run &#39;nope&#39; is not in this store' in run.text
    snap = many_ui.get('/runs/root/snapshots/3')
    assert snap.status == 404
    assert 'its retained snapshots: none' in snap.text
    assert many_ui.get('/no/such/page').status == 404


def test_a_damaged_record_is_named_and_the_rest_still_reads(
    demo_db: Path, tmp_path: Path, serve: Callable[..., Any]
) -> None:
    copy = tmp_path / 'damaged.db'
    shutil.copy(demo_db, copy)
    with closing(sqlite3.connect(copy)) as connection, connection:
        connection.execute("UPDATE runs SET record = '{not json' WHERE run_id = 'report-run-2'")
    ui = serve('--store', f'sqlite:///{copy}')
    listing = ui.get('/')
    assert listing.status == 200
    assert _run_ids(listing.text) == ['report-run-1.research', 'report-run-1']  # skipped, with a warning
    page = ui.get('/runs/report-run-2')
    assert page.status == 500
    assert 'report-run-2' in page.text
    assert 'run record' in page.text
    assert ui.get('/runs/report-run-1').status == 200


# -- the command ----------------------------------------------------------------------------------------


def _ui_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, '-m', 'stepcore.cli', 'ui', *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={'PATH': '/usr/bin:/bin'},
    )


def test_command_errors_say_what_to_do(tmp_path: Path) -> None:
    missing = _ui_command('--store', f'sqlite:///{tmp_path}/none.db')
    assert missing.returncode == 1
    assert 'does not exist' in missing.stderr
    nostore = _ui_command()
    assert nostore.returncode == 1
    assert 'pass --store URL or set STEPCORE_STORE' in nostore.stderr
    media = _ui_command('--store', f'sqlite:///{tmp_path}/none.db', '--media', 'nosuch://?x=1')
    assert media.returncode == 1
    assert "--media 'nosuch://?x=1'" in media.stderr


def test_a_port_in_use_is_reported(demo_db: Path) -> None:
    with socket.socket() as taken:
        taken.bind(('127.0.0.1', 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = _ui_command('--store', f'sqlite:///{demo_db}', '--port', str(port))
    assert result.returncode == 1
    assert f'cannot listen on 127.0.0.1:{port}' in result.stderr
    assert '--port 0 for any free one' in result.stderr


async def _write_once(database: Path, words: str, *, again: bool) -> None:
    store = SqliteStepStore(database=database)
    try:
        if again:
            assert await store.delete_run('rewritten')
        await store.register_run(RunRecord(run_id='rewritten', agent_name='writer'))
        history = [_ask(f'write about {words}'), _say(f'an essay on {words}')]
        await store.save_snapshot(ContinuableSnapshot(run_id='rewritten', step_index=1, messages=history))
    finally:
        await store.aclose()


def test_a_run_written_again_under_its_id_shows_what_is_stored_now(tmp_path: Path, serve: Callable[..., Any]) -> None:
    # The inspector keeps decoded snapshots between requests; a run deleted and written again
    # under the same id must not be shown from what it kept.
    path = tmp_path / 'rewritten.db'
    run_coroutine(_write_once(path, 'tides', again=False))
    ui = serve('--store', f'sqlite:///{path}')
    snapshots = ui.get('/runs/rewritten/snapshots').text
    seq = re.findall(r'/runs/rewritten/snapshots/(\d+)"', snapshots)[0]
    assert 'an essay on tides' in ui.get(f'/runs/rewritten/snapshots/{seq}').text
    run_coroutine(_write_once(path, 'glaciers', again=True))
    again = ui.get('/runs/rewritten/snapshots').text
    seq_again = re.findall(r'/runs/rewritten/snapshots/(\d+)"', again)[0]
    page = ui.get(f'/runs/rewritten/snapshots/{seq_again}').text
    assert 'an essay on glaciers' in page
    assert 'tides' not in page


async def _write_long(database: Path) -> None:
    store = SqliteStepStore(database=database)
    try:
        await store.register_run(RunRecord(run_id='long', agent_name='talker'))
        history = [_ask('turn 0') if n % 2 == 0 else _say(f'answer {n}') for n in range(440)]
        await store.save_snapshot(ContinuableSnapshot(run_id='long', step_index=1, messages=history))
        more = [*history, *(_ask(f'later {n}') if n % 2 == 0 else _say(f'later answer {n}') for n in range(10))]
        await store.save_snapshot(ContinuableSnapshot(run_id='long', step_index=2, messages=more))
    finally:
        await store.aclose()


def test_a_long_snapshot_pages_and_diffs_only_what_it_added(tmp_path: Path, serve: Callable[..., Any]) -> None:
    # The page reads only its own messages and what the snapshot adds to the one before it; the
    # messages are still numbered by their place in the whole history.
    path = tmp_path / 'long.db'
    run_coroutine(_write_long(path))
    ui = serve('--store', f'sqlite:///{path}')
    first, second = re.findall(r'/runs/long/snapshots/(\d+)"', ui.get('/runs/long/snapshots').text)
    newest = ui.get(f'/runs/long/snapshots/{second}').text
    assert '450 messages' in newest
    assert f'Against snapshot {first}:</strong> 440 kept, 10 added.' in newest
    shown = re.findall(r'<article class="msg [^"]*" id="m(\d+)">', newest)
    assert shown == [str(n) for n in range(400, 450)]  # the last page is the default
    marked = re.findall(r'<article class="msg msg-\w+ change-added" id="m(\d+)">', newest)
    assert marked == [str(n) for n in range(440, 450)]
    assert 'later answer 9' in newest
    opening = ui.get(f'/runs/long/snapshots/{second}?page=1').text
    assert re.findall(r'<article class="msg [^"]*" id="m(\d+)">', opening) == [str(n) for n in range(200)]
    assert 'answer 199' in opening
    assert 'answer 201' not in opening
    middle = ui.get(f'/runs/long/snapshots/{second}?page=2').text
    assert re.findall(r'<article class="msg [^"]*" id="m(\d+)">', middle)[0] == '200'
    changes = ui.get(f'/runs/long/snapshots/{second}?only=changes').text
    assert re.findall(r'<article [^>]* id="m(\d+)">', changes) == [str(n) for n in range(440, 450)]
