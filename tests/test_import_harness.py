"""`stepcore import --from-harness`: stores written by pydantic-ai-harness, copied into stepcore stores.

The sources are the fixtures the real pydantic-ai-harness wrote (0.62.0 and 0.57.0, SQLite and
files; see scripts/harness/make_fixtures.py), checked against the manifests it wrote beside them.
Targets are a SQLite file, a file store folder and PostgreSQL (`STEP_POSTGRES_URL`, each test in
a schema of its own).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic_ai import Agent, BinaryContent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from typer.testing import CliRunner

import stepcore
from stepcore import InMemoryStepStore, RunRecord, StepEvent, StepPersistence, StepStore, continue_run
from stepcore.cli import app
from stepcore.cli._loop import run_coroutine
from stepcore.harness import import_harness, restore_harness_media
from stepcore.recovery import inspect_recovery

PACKAGES = Path(__file__).resolve().parents[1] / 'packages'
SQLITE_FIXTURES = PACKAGES / 'step-sqlite/tests/fixtures/harness'
FILE_FIXTURES = PACKAGES / 'step-file/tests/fixtures/harness'
SOURCES = {
    'sqlite-0.62.0': (SQLITE_FIXTURES / 'harness.db', SQLITE_FIXTURES / 'manifest.json'),
    'sqlite-0.57.0': (SQLITE_FIXTURES / 'harness-0.57.0.db', SQLITE_FIXTURES / 'manifest-0.57.0.json'),
    'file-0.62.0': (FILE_FIXTURES / 'store', FILE_FIXTURES / 'manifest.json'),
    'file-0.57.0': (FILE_FIXTURES / 'store-0.57.0', FILE_FIXTURES / 'manifest-0.57.0.json'),
}
runner = CliRunner()


def _copy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / f'source-{source.name}'
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy(source, target)
    return target


def _manifest(name: str) -> dict[str, Any]:
    return json.loads(SOURCES[name][1].read_text())


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """`STEP_POSTGRES_URL` with a fresh schema first on the search path (dropped afterwards)."""
    url = os.environ.get('STEP_POSTGRES_URL', '').strip()
    if not url:
        pytest.fail('STEP_POSTGRES_URL is not set: `export STEP_POSTGRES_URL="$(scripts/postgres-server.sh start)"`')
    schema = f'harness_{uuid.uuid4().hex[:12]}'
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA {schema}')
    try:
        yield f'{url}{"&" if "?" in url else "?"}options=-csearch_path%3D{schema}'
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA {schema} CASCADE')


def _target(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == 'sqlite':
        return f'sqlite:///{tmp_path / "target.db"}'
    if kind == 'file':
        return f'file://{tmp_path / "target"}'
    return request.getfixturevalue('postgres_url')


def _import(source: Path, url: str) -> tuple[int, str]:
    result = runner.invoke(app, ['import', '--from-harness', str(source), '--store', url], env={'COLUMNS': '200'})
    return result.exit_code, result.stdout + result.stderr


def _counts(output: str) -> dict[str, int]:
    """The summary table's rows, by their first words."""
    counts: dict[str, int] = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip('│ ').split('│')]
        if len(cells) == 2 and cells[1].isdigit():
            counts[cells[0]] = int(cells[1])
    return counts


async def _snapshots(store: StepStore, run_id: str) -> list[stepcore.ContinuableSnapshot]:
    """Every retained snapshot, interrupted ones included, whichever `list_snapshots` the store has."""
    try:
        return await store.list_snapshots(run_id, include_interrupted=True)  # type: ignore[call-arg]
    except TypeError:
        return await store.list_snapshots(run_id)


async def _as_manifest(store: StepStore, run_id: str) -> dict[str, Any]:
    """What the store holds of a run, in the terms of the fixture manifest."""
    record = await store.get_run(run_id)
    assert record is not None, run_id
    events = await store.list_events(run_id)
    snapshots = await _snapshots(store, run_id)
    effects = {e.tool_call_id: e for e in await store.list_tool_effects(run_id)}
    return {
        'agent_name': record.agent_name,
        'conversation_id': record.conversation_id,
        'parent_run_id': record.parent_run_id,
        'metadata': record.metadata,
        'has_registration_id': record.registration_id is not None,
        'events': [
            {
                'kind': e.kind.value,
                'step_index': e.step_index,
                'tool_call_id': e.tool_call_id,
                'tool_name': e.tool_name,
                'error': e.error,
                'idempotency_key': e.idempotency_key,
            }
            for e in events
        ],
        'snapshots': [
            {
                'step_index': s.step_index,
                'state': s.state.value,
                'idempotency_key': s.idempotency_key,
                'message_count': len(s.messages),
                'message_kinds': [m.kind for m in s.messages],
            }
            for s in snapshots
        ],
        'tool_effects': [
            {
                'tool_call_id': call_id,
                'tool_name': e.tool_name,
                'status': e.status.value,
                'idempotency_key': e.idempotency_key,
                'effect_summary': e.effect_summary,
            }
            for call_id, e in sorted(effects.items())
        ],
    }


def _expected(run: dict[str, Any]) -> dict[str, Any]:
    return {
        'agent_name': run['agent_name'],
        'conversation_id': run['conversation_id'],
        'parent_run_id': run['parent_run_id'],
        'metadata': run['metadata'],
        'has_registration_id': run['has_registration_id'],
        'events': run['events'],
        'snapshots': [{k: v for k, v in s.items() if k not in ('seq', 'externalized')} for s in run['snapshots']],
        'tool_effects': sorted(
            ({k: v for k, v in e.items() if k != 'has_ended_at'} for e in run['tool_effects']),
            key=lambda e: e['tool_call_id'],
        ),
    }


def _parts(messages: list[ModelMessage]) -> Iterator[Any]:
    for message in messages:
        yield from message.parts


async def check_against_manifest(store: StepStore, manifest: dict[str, Any]) -> None:
    """Every run of the manifest, as the harness read it back, is in `store` the same."""
    runs = manifest['runs']
    assert sorted(r.run_id for r in await store.list_runs()) == sorted(r['run_id'] for r in runs)
    for run in runs:
        assert await _as_manifest(store, run['run_id']) == _expected(run), run['run_id']
    media = next(r for r in runs if r['run_id'] == 'fx-media')
    latest = await store.latest_snapshot('fx-media')
    assert latest is not None
    digests = {m['kind']: m['sha256'] for m in media['media']}
    prompt = next(p for p in _parts(latest.messages) if isinstance(p, UserPromptPart))
    images = [c for c in prompt.content if isinstance(c, BinaryContent)]
    assert [len(i.data) for i in images] == [64 * 1024, 16]
    assert hashlib.sha256(images[0].data).hexdigest() == digests['binary']
    log = next(p for p in _parts(latest.messages) if isinstance(p, ToolReturnPart))
    assert hashlib.sha256(log.content.encode()).hexdigest() == digests['text']


async def check_resumes(store: StepStore) -> None:
    """The crashed run: its unresolved charge is reported, and a new run carries on from its settled snapshot."""
    report = await inspect_recovery(store=store, run_id='fx-crashed')
    assert [(e.tool_call_id, e.idempotency_key, e.effect_summary) for e in report.unresolved_effects] == [
        ('call-crash-2', 'charge-order-42', 'charge 1999 cents for order 42')
    ]
    assert report.completed_tools == ('reserve',)
    history = await continue_run(store, run_id='fx-crashed')
    assert isinstance(history[-1], ModelRequest)
    assert [p.tool_call_id for p in history[-1].parts if isinstance(p, ToolReturnPart)] == ['call-crash-1']
    seen: list[int] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(len(messages))
        return ModelResponse(parts=[TextPart('the book is reserved; the charge needs checking')])

    agent = Agent(
        FunctionModel(respond),
        name='shop_agent',
        capabilities=[StepPersistence(store=store, run_id='fx-crashed-resumed', agent_name='shop')],
    )
    result = await agent.run(message_history=history, conversation_id='conv-crash')
    assert result.output == 'the book is reserved; the charge needs checking'
    assert seen == [len(history)]
    resumed = await store.latest_snapshot('fx-crashed-resumed')
    assert resumed is not None
    # pydantic-ai stamps the request it sends again; its parts are the imported ones
    assert resumed.messages[: len(history) - 1] == history[:-1]
    assert resumed.messages[len(history) - 1].parts == history[-1].parts
    assert [e.kind.value for e in await store.list_events('fx-crashed-resumed')][-1] == 'run_completed'


@pytest.mark.parametrize('target_kind', ['sqlite', 'file', 'postgres'])
@pytest.mark.parametrize('source_name', list(SOURCES))
def test_import_copies_every_run_once(
    source_name: str, target_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    source = _copy(SOURCES[source_name][0], tmp_path)
    url = _target(target_kind, tmp_path, request)
    manifest = _manifest(source_name)
    total_events = sum(len(r['events']) for r in manifest['runs'])
    total_snapshots = sum(len(r['snapshots']) for r in manifest['runs'])

    code, output = _import(source, url)
    assert code == 0, output
    counts = _counts(output)
    assert counts['runs imported'] == len(manifest['runs'])
    assert counts['events'] == total_events
    assert counts['snapshots'] == total_snapshots
    assert counts['media payloads'] == 2
    assert counts['records left out: cannot be read'] == 0

    code, output = _import(source, url)
    assert code == 0, output
    again = _counts(output)
    assert again['runs imported'] == 0
    assert again['runs already imported (left as they are)'] == len(manifest['runs'])
    assert again['events'] == again['snapshots'] == 0

    async def check() -> None:
        store = stepcore.open_store(url)
        try:
            await check_against_manifest(store, manifest)
            await check_resumes(store)
        finally:
            await store.aclose()

    run_coroutine(check())


def test_an_interrupted_import_is_written_again_whole(tmp_path: Path) -> None:
    """A run without its record in the target (an import killed midway) is replaced, not added to."""
    url = f'sqlite:///{tmp_path / "target.db"}'

    async def leave_a_partial_run() -> None:
        store = stepcore.open_store(url)
        try:
            await store.append_event(StepEvent(run_id='fx-finished', kind=stepcore.EventKind.RUN_STARTED, step_index=0))
            await store.append_event(StepEvent(run_id='fx-finished', kind=stepcore.EventKind.RUN_STARTED, step_index=0))
        finally:
            await store.aclose()

    run_coroutine(leave_a_partial_run())
    code, output = _import(_copy(SOURCES['sqlite-0.62.0'][0], tmp_path), url)
    assert code == 0, output

    async def check() -> None:
        store = stepcore.open_store(url)
        try:
            await check_against_manifest(store, _manifest('sqlite-0.62.0'))
        finally:
            await store.aclose()

    run_coroutine(check())


def test_a_run_id_taken_by_another_run_is_left_alone(tmp_path: Path) -> None:
    url = f'sqlite:///{tmp_path / "target.db"}'
    ours = RunRecord(run_id='fx-finished', agent_name='someone_else', conversation_id='elsewhere')

    async def register() -> None:
        store = stepcore.open_store(url)
        try:
            await store.register_run(ours)
        finally:
            await store.aclose()

    run_coroutine(register())
    code, output = _import(_copy(SOURCES['file-0.62.0'][0], tmp_path), url)
    assert code == 1
    assert "run 'fx-finished' is already in the target store as another run" in output
    counts = _counts(output)
    assert counts['runs imported'] == 10
    assert counts['runs left out: another run has their id in the target'] == 1

    async def check() -> None:
        store = stepcore.open_store(url)
        try:
            assert await store.get_run('fx-finished') == ours
            assert await store.list_events('fx-finished') == []
            assert await store.get_run('fx-crashed') is not None
        finally:
            await store.aclose()

    run_coroutine(check())


def test_damaged_records_are_named_and_left_out(tmp_path: Path) -> None:
    source = _copy(SOURCES['file-0.62.0'][0], tmp_path)
    (source / 'fx-finished/snapshots/1.json').write_text('{"messages": [')
    events = source / 'fx-crashed/events.jsonl'
    lines = events.read_text().splitlines()
    events.write_text('\n'.join([lines[0], '{"kind": "not_a_kind"}', *lines[1:]]) + '\n')
    url = f'sqlite:///{tmp_path / "target.db"}'

    code, output = _import(source, url)
    assert code == 1
    assert "snapshot snapshots/1.json of run 'fx-finished' cannot be read" in output
    assert "line 2 of events.jsonl of run 'fx-crashed' cannot be read" in output
    assert _counts(output)['records left out: cannot be read'] == 2

    manifest = _manifest('file-0.62.0')
    expected = {r['run_id']: r for r in manifest['runs']}

    async def check() -> None:
        store = stepcore.open_store(url)
        try:
            assert len(await store.list_snapshots('fx-finished')) == len(expected['fx-finished']['snapshots']) - 1
            assert len(await store.list_events('fx-crashed')) == len(expected['fx-crashed']['events'])
            run = await _as_manifest(store, 'fx-media')
            assert run == _expected(expected['fx-media'])
        finally:
            await store.aclose()

    run_coroutine(check())


def _fails(args: list[str], needle: str) -> None:
    result = runner.invoke(app, args, env={'COLUMNS': '200'})
    assert result.exit_code == 1, result.stdout
    assert needle in ' '.join(result.stderr.split()), result.stderr


def test_what_cannot_be_imported_is_refused_with_what_to_do(tmp_path: Path) -> None:
    target = f'sqlite:///{tmp_path / "target.db"}'
    _fails(['import', '--from-harness', str(tmp_path / 'missing.db'), '-s', target], 'does not exist')
    (tmp_path / 'notes.txt').write_text('hello')
    _fails(['import', '--from-harness', str(tmp_path / 'notes.txt'), '-s', target], 'is neither a SQLite database')
    (tmp_path / 'empty').mkdir()
    _fails(['import', '--from-harness', str(tmp_path / 'empty'), '-s', target], 'holds no pydantic-ai-harness runs')
    source = _copy(SOURCES['sqlite-0.62.0'][0], tmp_path)
    _fails(['import', '--from-harness', str(source), '-s', f'sqlite:///{source}'], 'names')
    _fails(['import', '-s', target], 'give one thing to import')
    _fails(['import', 'export.json', '--from-harness', str(source), '-s', target], 'give one thing to import')
    code, output = _import(source, target)
    assert code == 0, output
    _fails(
        ['import', '--from-harness', str(tmp_path / 'target.db'), '-s', 'sqlite:///other.db'], 'is a stepcore database'
    )
    folder = f'file://{tmp_path / "ours"}'
    assert _import(source, folder)[0] == 0
    _fails(['import', '--from-harness', str(tmp_path / 'ours'), '-s', target], 'is a stepcore file store')


async def test_import_from_python_into_any_store(tmp_path: Path) -> None:
    store = InMemoryStepStore()
    summary = await import_harness(_copy(SOURCES['sqlite-0.57.0'][0], tmp_path), store)
    assert summary.complete
    assert len(summary.imported) == 11
    await check_against_manifest(store, _manifest('sqlite-0.57.0'))
    again = await import_harness(SOURCES['file-0.57.0'][0], store)
    assert again.imported == []
    assert len(again.conflicts) == 11  # the same scenarios, run again by the file store: other runs


@pytest.mark.parametrize(
    'source', [SQLITE_FIXTURES / 'harness-pre-state.db', FILE_FIXTURES / 'store-pre-state'], ids=['sqlite', 'file']
)
def test_the_layout_without_state_and_keys_imports(source: Path, tmp_path: Path) -> None:
    url = f'sqlite:///{tmp_path / "target.db"}'
    code, output = _import(_copy(source, tmp_path), url)
    assert code == 0, output
    expected = json.loads((source.parent / 'manifest.json').read_text())['pre_state']['runs']

    async def check() -> None:
        store = stepcore.open_store(url)
        try:
            for run in expected:
                record = await store.get_run(run['run_id'])
                assert record is not None
                assert (record.agent_name, record.conversation_id, record.registration_id) == (
                    run['agent_name'],
                    run['conversation_id'],
                    None,
                )
                snapshots = await _snapshots(store, run['run_id'])
                assert [(s.state.value, s.step_index, len(s.messages)) for s in snapshots] == [
                    ('complete', step, count)
                    for step, count in zip(run['snapshot_step_indexes'], run['message_counts'], strict=True)
                ]
                events = await store.list_events(run['run_id'])
                assert [e.kind.value for e in events] == run['event_kinds']
                assert all(e.idempotency_key is None for e in events)
                effects = [(e.tool_call_id, e.status.value) for e in await store.list_tool_effects(run['run_id'])]
                assert effects == [(e['tool_call_id'], e['status']) for e in run['tool_effects']]
        finally:
            await store.aclose()

    run_coroutine(check())


def test_records_of_a_run_without_its_record_are_imported(tmp_path: Path) -> None:
    """The harness lets a run's events and snapshots be written without `register_run`."""
    source = _copy(SOURCES['sqlite-0.62.0'][0], tmp_path)
    with sqlite3.connect(source) as conn:
        conn.execute("DELETE FROM runs WHERE run_id = 'fx-finished'")
    url = f'sqlite:///{tmp_path / "target.db"}'
    expected = next(r for r in _manifest('sqlite-0.62.0')['runs'] if r['run_id'] == 'fx-finished')

    async def check() -> None:
        store = stepcore.open_store(url)
        try:
            assert await store.get_run('fx-finished') is None
            assert len(await store.list_events('fx-finished')) == len(expected['events'])
            assert len(await _snapshots(store, 'fx-finished')) == len(expected['snapshots'])
            assert len(await continue_run(store, run_id='fx-finished')) == expected['snapshots'][-1]['message_count']
        finally:
            await store.aclose()

    code, output = _import(source, url)
    assert code == 0, output
    assert _counts(output)['runs imported'] == 11
    run_coroutine(check())
    code, output = _import(source, url)  # written again whole, never added to
    assert code == 0, output
    counts = _counts(output)
    assert (counts['runs imported'], counts['runs already imported (left as they are)']) == (1, 10)
    run_coroutine(check())


def test_a_harness_database_that_lacks_a_blob_names_it(tmp_path: Path) -> None:
    source = _copy(SOURCES['sqlite-0.62.0'][0], tmp_path)
    with sqlite3.connect(source) as conn:
        conn.execute('DELETE FROM media WHERE size_bytes = 65536 AND media_type = ?', ('image/png',))
    code, output = _import(source, f'sqlite:///{tmp_path / "target.db"}')
    assert code == 1
    assert 'is not in the media table of database' in ' '.join(output.split())


# -- the marker shapes, as the harness writes them -----------------------------------------------

PAYLOAD = bytes(range(256)) * 4
URI = 'media+sha256://' + hashlib.sha256(PAYLOAD).hexdigest()


def _blob(uri: str) -> bytes:
    assert uri == URI
    return PAYLOAD


def test_markers_of_every_release_are_put_back() -> None:
    binary = {'kind': 'binary', 'media_type': 'image/png', 'identifier': 'x'}
    # 0.20: the URI in `uri` alone
    assert restore_harness_media({**binary, '__harness_external_media__': True, 'uri': URI}, _blob) == {
        **binary,
        'data': base64.b64encode(PAYLOAD).decode(),
    }
    # 0.30-0.59: the namespaced URI, mirrored to `uri`
    marker = {**binary, '__harness_external_media__': True, '__harness_external_uri__': URI, 'uri': URI}
    assert restore_harness_media(marker, _blob) == {**binary, 'data': base64.b64encode(PAYLOAD).decode()}
    # 0.60-0.62: URL-safe source alphabet recorded
    urlsafe = {**marker, '__harness_external_urlsafe__': 'base64-urlsafe-v1'}
    assert restore_harness_media(urlsafe, _blob)['data'] == base64.urlsafe_b64encode(PAYLOAD).decode()
    # the original had a `uri` of its own: no mirror, and it stays
    own_uri = {**binary, 'uri': 'https://example.invalid/a.png', '__harness_external_media__': True}
    own_uri['__harness_external_uri__'] = URI
    assert restore_harness_media(own_uri, _blob)['uri'] == 'https://example.invalid/a.png'
    # text, inside a list, unpaired surrogates passed through
    text = {'part_kind': 'text', '__harness_external_media__': True, '__harness_external_text__': True}
    text['__harness_external_uri__'] = URI
    blob_text = '\ud800'.encode('utf-8', 'surrogatepass')
    assert restore_harness_media([text], lambda uri: blob_text) == [{'part_kind': 'text', 'content': '\ud800'}]


def test_escaped_keys_and_literal_wrappers_give_back_the_callers_data() -> None:
    escaped = {
        'kind': 'binary',
        '__harness_external_media__': True,
        '__harness_external_uri__': URI,
        'uri': URI,
        '__harness_external_marker_format__': 'escaped-keys-v1',
        '__harness_external_escaped_keys__': {'__harness_external_uri__': 'the caller own'},
    }
    assert restore_harness_media(escaped, _blob) == {
        'kind': 'binary',
        '__harness_external_uri__': 'the caller own',
        'data': base64.b64encode(PAYLOAD).decode(),
    }
    caller = {'__harness_external_media__': True, 'note': 'not a marker'}
    wrapped = {'__harness_external_literal__': caller, '__harness_external_marker_format__': 'literal-v1'}
    assert restore_harness_media({'content': wrapped}, _blob) == {'content': caller}
    # keys that only look like an escape stash stay the payload's own
    lookalike = {**escaped, '__harness_external_escaped_keys__': {'other': 1}}
    assert restore_harness_media(lookalike, _blob)['__harness_external_escaped_keys__'] == {'other': 1}


@pytest.mark.parametrize(
    ('node', 'needle'),
    [
        (
            {'__harness_external_literal__': {}, '__harness_external_marker_format__': 'literal-v2'},
            "format 'literal-v2'",
        ),
        (
            {
                '__harness_external_media__': True,
                '__harness_external_uri__': URI,
                '__harness_external_marker_format__': 'escaped-keys-v9',
                '__harness_external_escaped_keys__': {'__harness_external_uri__': 'x'},
            },
            "format 'escaped-keys-v9'",
        ),
        ({'__harness_external_media__': True}, 'has no media URI'),
    ],
)
def test_markers_this_release_cannot_read_are_refused(node: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        restore_harness_media(node, _blob)
