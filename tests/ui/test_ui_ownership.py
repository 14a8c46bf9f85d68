"""Who held a run, in the inspector over HTTP: the run page's ownership section, the ownership changes
among the timeline's events, and the job page listing a job's runs with who owned each when.

The runs are made by a real `pydantic_ai.Agent` with `StepPersistence` on SQLite: one that failed while
a process on another host held its lease, then was taken over by recovery in this process, handed to
its resumption, and had a late write of its first owner refused; a job that paused on an approval and
was resumed once answered; runs without a lease, or with a lease that records no changes. A store that
keeps no leases is read in this process, through the app itself.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from step_sqlite import SqliteStepStore
from stepcore import EventKind, RunRecord, StepEvent, StepPersistence, approve_call, resolve_run, resume_run, start_job
from stepcore.cli._loop import run_coroutine
from stepcore.common.features import LEASES
from stepcore.ownership import open_lease
from stepcore.ownership.claims import lease_template, read_lease
from stepcore.ownership.identity import host_name
from stepcore.store.leases import Fence, LeaseState, Owner, OwnershipChange, RunFencedError, fencing
from stepcore.ui import create_app

ELSEWHERE = Owner(host='another-host.invalid', pid=4242, token='held-elsewhere')
HERE = f'{host_name()} pid {os.getpid()}'
"""This process, as a lease owner names it: recovery runs here."""


class CarrierDown(Exception):
    pass


def _ship_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    done = {p.tool_name for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if 'ship' in done:
        return ModelResponse(parts=[TextPart('shipped')])
    if 'quote' in done:
        return ModelResponse(parts=[ToolCallPart('ship', {'order': 7}, tool_call_id='call-ship')])
    return ModelResponse(parts=[ToolCallPart('quote', {'order': 7}, tool_call_id='call-quote')])


def _shipper(store: SqliteStepStore, *, lease_ttl: float | None = 30.0, down: bool = False) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(_ship_model), name='shipper', capabilities=[StepPersistence(store=store, lease_ttl=lease_ttl)]
    )

    @agent.tool_plain
    def quote(order: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'order {order}: 12 EUR'

    @agent.tool_plain
    def ship(order: int) -> str:  # pyright: ignore[reportUnusedFunction]
        if down:
            raise CarrierDown(f'the carrier is down: order {order} not shipped')
        return f'order {order} shipped'

    return agent


def _dba_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    if any(isinstance(p, ToolReturnPart) and p.tool_call_id == 'call-drop' for m in messages for p in m.parts):
        return ModelResponse(parts=[TextPart('dropped')])
    return ModelResponse(parts=[ToolCallPart('drop_table', {'name': 'users'}, tool_call_id='call-drop')])


def _dba(store: SqliteStepStore) -> Agent[None, str | DeferredToolRequests]:
    agent = Agent(
        FunctionModel(_dba_model),
        name='dba',
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store=store)],
    )

    @agent.tool_plain(requires_approval=True)
    def drop_table(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'dropped {name}'

    return agent


async def _taken_over(store: SqliteStepStore) -> str:
    """`ship-1`: its lease taken by a process on another host (expired at once), the run failed in `ship`;
    recovery here takes it over and resumes it; then a late write of the first owner is refused.
    Answers the resumption's id."""
    await open_lease(store, 'ship-1', ttl=0.0, owner=ELSEWHERE)
    with pytest.raises(CarrierDown):
        await _shipper(store, lease_ttl=None, down=True).run('ship order 7', run_id='ship-1')
    agent = _shipper(store)
    resumption = await resolve_run(store, run_id='ship-1', agent=agent, policies={'ship': 'rerun'})
    result = await resumption.run(agent)
    assert result.output == 'shipped'
    late = StepEvent(run_id='ship-1', kind=EventKind.TOOL_CALL_COMPLETED, step_index=2, tool_call_id='call-ship')
    with fencing(Fence('ship-1', 1)), pytest.raises(RunFencedError):
        await store.append_event(late)
    return result.run_id


async def _fill(database: Path) -> tuple[str, str]:
    store = SqliteStepStore(database=database)
    try:
        resumed = await _taken_over(store)
        dba = _dba(store)
        paused = await start_job(dba, 'drop the users table', job_id='nightly-ops')
        assert paused.status == 'waiting'
        await approve_call(store, run_id='nightly-ops', tool_call_id='call-drop', by='alice')
        answered = await resume_run(store, run_id='nightly-ops', agent=dba)
        assert answered.output == 'dropped'
        await _shipper(store).run('ship order 8', run_id='solo-1')
        # a run with no lease (started without one), and a lease as a store kept it before it kept history
        await store.register_run(RunRecord(run_id='plain-1', agent_name='shipper'))
        await store.register_run(RunRecord(run_id='old-lease-1', agent_name='shipper'))
        bare = lease_template('old-lease-1', epoch=1, state=LeaseState.ENDED, owner=None, origin='old-lease-1')
        swapped, _ = await store.swap_lease(bare, expect=None, ttl=0.0)
        assert swapped
        return resumed, answered.run_id
    finally:
        await store.aclose()


@dataclass
class Served:
    ui: Any
    database: Path
    resumed: str
    """The run that resumes `ship-1`."""
    answered: str
    """The run that resumed the job `nightly-ops` once its approval was given."""

    def page(self, path: str) -> str:
        found = self.ui.get(path)
        assert found.status == 200, found.text
        return html.unescape(found.text)


@pytest.fixture(scope='module')
def served(tmp_path_factory: pytest.TempPathFactory, serve: Callable[..., Any]) -> Served:
    database = tmp_path_factory.mktemp('ui-ownership') / 'runs.db'
    resumed, answered = run_coroutine(_fill(database))
    return Served(ui=serve('--store', f'sqlite:///{database}'), database=database, resumed=resumed, answered=answered)


def _section(page: str, name: str) -> str:
    start = page.index(f'<section id="{name}">')
    return page[start : page.index('</section>', start)]


def _text(fragment: str) -> str:
    """What a person reads in `fragment`: its words, without the spaces its tags left before punctuation."""
    words = ' '.join(re.sub(r'<[^>]+>', ' ', fragment).split())
    return re.sub(r'\( ', '(', re.sub(r' ([:.,;)])', r'\1', words))


def _changes(fragment: str) -> list[tuple[str, str]]:
    """The ownership history's rows in `fragment`: (kind, what a person reads in the row)."""
    rows = re.findall(r'<tr class="change-(\w+)">(.*?)</tr>', fragment, flags=re.S)
    return [(kind, _text(row)) for kind, row in rows]


def test_the_run_page_shows_who_held_a_run_taken_over(served: Served) -> None:
    page = served.page('/runs/ship-1')
    ownership = _section(page, 'ownership')
    changes = _changes(ownership)
    assert [kind for kind, _ in changes] == ['lease_taken', 'lease_taken_over', 'lease_handed_on', 'write_refused']
    taken, over, handed, refused = (text for _, text in changes)
    assert 'taken by another-host.invalid pid 4242 at epoch 1' in taken
    assert re.match(r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d lease_taken ', taken)  # its time, in UTC
    assert f'taken over by {HERE} (recovering it) from another-host.invalid pid 4242 at epoch 1, now epoch 2' in over
    assert 'lease expired' in over
    assert f'handed to its resumption {served.resumed} by {HERE} (recovering it), epoch 3' in handed
    assert f'write refused: {HERE} still held epoch 1 (the run is at epoch 3)' in refused
    # takeovers and refused writes are marked
    over_row = ownership[ownership.index('<tr class="change-lease_taken_over">') :].split('</tr>')[0]
    assert '<span class="badge takeover"' in over_row
    refused_row = ownership[ownership.index('<tr class="change-write_refused">') :].split('</tr>')[0]
    assert '<span class="badge refused"' in refused_row
    assert ownership.count('class="badge takeover"') == 1
    # the run that carries it on, where it went on, and the job they make
    said = _text(ownership)
    assert f'Resumed by {served.resumed} on {HERE}: that run carries it on' in said
    assert f'href="/runs/{served.resumed}"' in ownership
    assert 'Part of job ship-1: 2 runs' in said
    assert 'href="/jobs/ship-1"' in ownership
    assert 'href="/jobs/ship-1"' in page[: page.index('<section id="recovery">')]  # among the run's facts


def test_the_resumption_links_back_to_the_run_it_resumes(served: Served) -> None:
    page = served.page(f'/runs/{served.resumed}')
    ownership = _section(page, 'ownership')
    said = _text(ownership)
    assert 'Resumes ship-1: it carries that run on' in said
    assert 'href="/runs/ship-1"' in ownership
    assert 'Part of job ship-1: 2 runs' in said
    changes = _changes(ownership)
    assert [kind for kind, _ in changes] == ['lease_taken', 'lease_released']
    assert f'taken by {HERE} at epoch 3 (resumes run ship-1)' in changes[0][1]
    assert f'released by {HERE}: ended (completed), epoch 3' in changes[1][1]
    assert 'badge takeover' not in ownership
    assert 'badge refused' not in ownership


def test_the_timeline_shows_the_ownership_changes_among_the_events(served: Served) -> None:
    page = served.page('/runs/ship-1/timeline')
    body = page[page.index('<tbody>') : page.index('</tbody>')]
    kinds = re.findall(r'<tr class="(?:ownership-change )?kind-(\w+)', body)
    events = [k for k in kinds if not k.startswith(('lease_', 'write_'))]
    assert events[0] == 'run_started'
    assert kinds.index('lease_taken') < kinds.index('run_started')  # another host took it, then it ran
    assert kinds.index('run_failed') < kinds.index('lease_taken_over')
    assert kinds.index('lease_taken_over') < kinds.index('lease_handed_on') < kinds.index('write_refused')
    assert kinds[-1] == 'write_refused'
    rows = dict(re.findall(r'<tr class="ownership-change kind-(\w+)"[^>]*>(.*?)</tr>', body, flags=re.S))
    assert set(rows) == {'lease_taken', 'lease_taken_over', 'lease_handed_on', 'write_refused'}
    assert 'taken by another-host.invalid pid 4242 at epoch 1' in _text(rows['lease_taken'])
    assert 'from another-host.invalid pid 4242 at epoch 1, now epoch 2' in _text(rows['lease_taken_over'])
    assert 'class="badge takeover"' in rows['lease_taken_over']
    assert 'class="badge refused"' in rows['write_refused']
    assert re.search(r'<td class="when">-[\d.]+ ms</td>', rows['lease_taken'])  # before the run's first event
    assert re.search(r'<td class="when">\+[\d.]+ m?s</td>', rows['write_refused'])
    # the step events keep their own rows and ids; the changes never take an event's id
    assert len(re.findall(r'<tr class="kind-\w+[^"]*" id="e\d+">', body)) == len(events)
    assert 'The 4 changes of the run' in _text(page)


def test_each_change_is_on_the_timeline_page_of_the_events_around_it(served: Served) -> None:
    from stepcore.ui.timeline import ChangeRow, TimelineRow, timeline_page

    async def pages() -> tuple[list[list[TimelineRow | ChangeRow]], tuple[OwnershipChange, ...]]:
        store = SqliteStepStore(database=served.database)
        try:
            lease = await read_lease(store, 'ship-1')
            assert lease is not None
            found: list[list[TimelineRow | ChangeRow]] = []
            number = 1
            while True:
                rows, page, _ = await timeline_page(store, 'ship-1', number, size=3, changes=lease.history)
                found.append(rows)
                if number == page.count:
                    return found, lease.history
                number += 1
        finally:
            await store.aclose()

    found, history = run_coroutine(pages())
    assert len(found) > 2
    shown = [row.change for rows in found for row in rows if isinstance(row, ChangeRow)]
    assert shown == list(history)  # every change once, in order, over the pages
    assert isinstance(found[0][0], ChangeRow)  # the lease was taken before the run's first event
    assert found[0][0].kind == 'lease_taken'
    for rows in found:
        events = [row.event.timestamp for row in rows if isinstance(row, TimelineRow)]
        assert events, 'a page holds events'
        for index, row in enumerate(rows):
            if isinstance(row, ChangeRow):
                before = [r.event.timestamp for r in rows[:index] if isinstance(r, TimelineRow)]
                after = [r.event.timestamp for r in rows[index + 1 :] if isinstance(r, TimelineRow)]
                assert all(t <= row.change.at for t in before)
                assert all(row.change.at < t for t in after)
    assert found[-1][-1].kind == 'write_refused'  # after the run's last event: on the last page


def test_the_job_page_lists_its_runs_with_who_held_each(served: Served) -> None:
    page = served.page('/jobs/ship-1')
    assert re.search(r'<h1>Job ship-1 <span class="badge job-status status-completed"', page)
    runs = re.findall(r'<li class="job-run" id="job-run-\d+">(.*?)</li>\n(?=<li class="job-run"|</ol>)', page, re.S)
    assert len(runs) == 2
    first, second = runs
    assert re.findall(r'<h2><a class="run-id" href="/runs/([^"]+)">', page) == ['ship-1', served.resumed]
    assert [k for k, _ in _changes(first)] == ['lease_taken', 'lease_taken_over', 'lease_handed_on', 'write_refused']
    assert 'another-host.invalid pid 4242 at epoch 1' in _text(first)
    assert 'class="badge takeover"' in first
    assert 'class="badge refused"' in first
    assert f'Resumed by {served.resumed} on {HERE}' in _text(first)
    assert 'lease-resumed' in first
    assert 'unfinished' in _text(first)
    assert [k for k, _ in _changes(second)] == ['lease_taken', 'lease_released']
    assert 'Resumes ship-1' in _text(second)
    assert 'badge status-completed' in second
    assert 'lease-ended' in second


def test_a_resumption_leads_to_its_job_and_an_unknown_job_is_named(served: Served) -> None:
    moved = served.ui.get(f'/jobs/{served.resumed}')
    assert moved.status == 303
    assert moved.header('location') == '/jobs/ship-1'
    missing = served.ui.get('/jobs/no-such-job')
    assert missing.status == 404
    said = html.unescape(missing.text)
    assert "the store has no job 'no-such-job'" in said
    assert 'back to the runs' in said


def test_searching_a_job_id_opens_the_job(served: Served) -> None:
    for job in ('ship-1', 'nightly-ops'):
        found = served.ui.get(f'/?q={job}')
        assert found.status == 303
        assert found.header('location') == f'/jobs/{job}'
    single = served.ui.get('/?q=solo-1')  # a run nothing resumed is a run, as before
    assert single.status == 303
    assert single.header('location') == '/runs/solo-1'
    listed = served.page('/?q=s')
    assert 'href="/runs/ship-1"' in listed
    assert 'href="/runs/solo-1"' in listed


def test_a_paused_job_shows_the_answers_its_run_got(served: Served) -> None:
    page = served.page('/jobs/nightly-ops')
    assert 'class="badge job-status status-completed"' in page
    assert re.findall(r'<h2><a class="run-id" href="/runs/([^"]+)">', page) == ['nightly-ops', served.answered]
    first = page[page.index('id="job-run-1"') : page.index('id="job-run-2"')]
    assert 'Paused on 1 deferred tool call at ' in _text(first)
    drop = _text(first[first.index('id="answer-call-drop"') :].split('</tr>')[0])
    assert 'drop_table' in drop
    assert 'approved alice' in drop
    assert f'{served.answered} resumed it with them' in _text(first)
    changes = _changes(first)
    assert [k for k, _ in changes] == ['lease_taken', 'lease_released', 'lease_taken_over', 'lease_handed_on']
    assert 'released by' in changes[1][1]
    assert 'waiting (paused)' in changes[1][1]
    assert f'taken over by {HERE} (recovering it)' in changes[2][1]
    assert 'it was waiting' in changes[2][1]  # a pause is taken over to be resumed, not because it died
    second = page[page.index('id="job-run-2"') :]
    assert 'id="answer-call-drop"' not in second  # its answers are the paused run's, listed once
    run = served.page('/runs/nightly-ops')
    ownership = _section(run, 'ownership')
    assert 'Part of job nightly-ops: 2 runs' in _text(ownership)
    assert 'href="/jobs/nightly-ops"' in ownership


def test_runs_without_an_ownership_history_say_so(served: Served) -> None:
    solo = _section(served.page('/runs/solo-1'), 'ownership')
    assert [k for k, _ in _changes(solo)] == ['lease_taken', 'lease_released']
    assert 'Part of job' not in solo  # a run of its own is no job
    assert '/jobs/' not in served.page('/runs/solo-1')
    plain = _text(_section(served.page('/runs/plain-1'), 'ownership'))
    assert 'This run has no lease (it was started without one): no ownership changes are recorded' in plain
    old = _text(_section(served.page('/runs/old-lease-1'), 'ownership'))
    assert 'Its lease records no ownership changes' in old
    assert re.search(r'Its lease: ended( \([a-z ]+\))?, epoch 1\.', old), old
    for run_id in ('plain-1', 'old-lease-1'):
        assert 'ownership-change' not in served.page(f'/runs/{run_id}/timeline')
    timeline = served.page('/runs/solo-1/timeline')
    kinds = re.findall(r'<tr class="(?:ownership-change )?kind-(\w+)', timeline)
    assert kinds[:2] == ['lease_taken', 'run_started']
    assert kinds[-2:] == ['run_completed', 'lease_released']


# -- a store that keeps no leases, read through the app in this process ----------------------------------


class NoLeaseStore(SqliteStepStore):
    """SQLite as a backend that keeps no leases would be."""

    features: ClassVar[frozenset[str]] = SqliteStepStore.features - {LEASES}


async def _get(app: Any, path: str) -> tuple[int, dict[str, str], str]:
    """GET `path` from the ASGI app: its status, headers and body."""
    target, _, query = path.partition('?')
    scope = {
        'type': 'http',
        'asgi': {'version': '3.0'},
        'http_version': '1.1',
        'method': 'GET',
        'scheme': 'http',
        'path': target,
        'raw_path': target.encode(),
        'query_string': query.encode(),
        'root_path': '',
        'headers': [(b'host', b'localhost')],
        'client': ('127.0.0.1', 50000),
        'server': ('127.0.0.1', 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {'type': 'http.request', 'body': b'', 'more_body': False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    headers = {k.decode(): v.decode() for k, v in sent[0].get('headers', [])}
    body = b''.join(m.get('body', b'') for m in sent[1:])
    return sent[0]['status'], headers, html.unescape(body.decode())


def test_a_store_without_leases_says_it_records_no_owners(tmp_path: Path) -> None:
    async def check() -> None:
        store = NoLeaseStore(database=tmp_path / 'runs.db')
        try:
            dba = _dba(store)
            assert isinstance((await dba.run('drop it', run_id='pause-1')).output, DeferredToolRequests)
            await approve_call(store, run_id='pause-1', tool_call_id='call-drop', by='alice')
            resumed = (await resume_run(store, run_id='pause-1', agent=dba)).run_id
            app = create_app(store, store_url=f'sqlite:///{tmp_path / "runs.db"}')
            status, _, page = await _get(app, '/runs/pause-1')
            assert status == 200, page
            ownership = _text(_section(page, 'ownership'))
            assert 'This store keeps no leases: it does not record who held a run' in ownership
            assert f'Resumed by {resumed}: that run carries it on' in ownership
            assert 'Part of job pause-1: 2 runs' in ownership
            status, _, page = await _get(app, f'/runs/{resumed}')
            assert 'Resumes pause-1' in _text(_section(page, 'ownership'))
            status, _, page = await _get(app, '/jobs/pause-1')
            assert status == 200, page
            assert re.findall(r'<h2><a class="run-id" href="/runs/([^"]+)">', page) == ['pause-1', resumed]
            assert 'approved alice' in _text(page)
            assert 'class="badge job-status status-completed"' in page
            status, headers, _ = await _get(app, f'/jobs/{resumed}')
            assert (status, headers['location']) == (303, '/jobs/pause-1')
            status, headers, _ = await _get(app, '/?q=pause-1')
            assert (status, headers['location']) == (303, '/jobs/pause-1')
            status, _, page = await _get(app, '/runs/pause-1/timeline')
            assert status == 200
            assert 'ownership-change' not in page
        finally:
            await store.aclose()

    run_coroutine(check())
