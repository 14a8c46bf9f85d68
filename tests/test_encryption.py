"""Encryption at rest: what a store keeps holds none of a run's text, and reads back with the key.

Each store is given `encryption=`, runs a real agent whose prompt, tool return and media carry
marker strings, and the test reads the stored bytes the backend's own way (the SQLite file, every
file of a file store's folder, the PostgreSQL rows as text) to find that no marker is there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
import pytest
from pydantic_ai import Agent, BinaryContent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_file import FileStepStore
from step_postgres import PostgresStepStore
from step_sqlite import SqliteStepStore
from step_sqlite.records import unpack_body
from stepcore import (
    DamagedRecordError,
    Encryption,
    EncryptionKeyError,
    StepPersistence,
    StepStore,
    generate_key,
    open_store,
)

PROMPT_MARKER = 'prompt-marker-4f1c'
TOOL_MARKER = 'tool-return-marker-9a2e'
MEDIA_MARKER = b'media-blob-marker-77d0'
MARKERS = (PROMPT_MARKER.encode(), TOOL_MARKER.encode(), MEDIA_MARKER)


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    calls = sum(1 for m in messages if isinstance(m, ModelResponse))
    if calls < 1:
        return ModelResponse(parts=[ToolCallPart('look', {'what': 'it'}, tool_call_id='call-0')])
    return ModelResponse(parts=[TextPart('seen')])


async def _run(store: StepStore) -> str:
    persistence = StepPersistence(store=store)
    agent = Agent(FunctionModel(_model), capabilities=[persistence])

    @agent.tool_plain
    def look(what: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'{TOOL_MARKER} about {what}'

    # the media blob is big enough to be externalized to the store's media store
    image = BinaryContent(data=MEDIA_MARKER * 5000, media_type='image/png')
    result = await agent.run([PROMPT_MARKER, image], run_id=f'enc-{uuid.uuid4().hex[:8]}')
    return result.run_id


async def _check_round_trip(store: StepStore, run_id: str) -> None:
    latest = await store.latest_snapshot(run_id)
    assert latest is not None
    text = repr(latest.messages)
    assert PROMPT_MARKER in text
    assert TOOL_MARKER in text
    assert any(
        isinstance(c, BinaryContent) and c.data == MEDIA_MARKER * 5000
        for m in latest.messages
        for p in m.parts
        for c in getattr(p, 'content', [])
        if not isinstance(c, str)
    )
    (effect,) = await store.list_tool_effects(run_id)
    assert effect.tool_call_id == 'call-0'
    assert [r.run_id for r in await store.list_runs()].count(run_id) == 1
    assert await store.list_events(run_id)


def _folder_bytes(folder: Path) -> bytes:
    return b''.join(p.read_bytes() for p in sorted(folder.rglob('*')) if p.is_file())


def _rows_except(db: Path, skipped: str) -> bytes:
    import sqlite3

    found = b''
    with sqlite3.connect(db) as raw:
        tables = [r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            if table == skipped:
                continue
            for row in raw.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    # message bodies may be stored compressed: look at them as the store reads them
                    # (other binary columns, such as a lease's start point, are stored as they are)
                    if isinstance(value, bytes):
                        found += unpack_body(value) if table == 'message_nodes' else value
                    else:
                        found += str(value).encode()
    return found


def _no_markers(raw: bytes) -> None:
    for marker in MARKERS:
        assert marker not in raw, f'{marker!r} is stored in clear'


@pytest.fixture
def encryption() -> Encryption:
    return Encryption(keys={'k1': generate_key()})


async def test_sqlite_stores_nothing_in_clear(tmp_path: Path, encryption: Encryption) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db, encryption=encryption)
    run_id = await _run(store)
    await store.aclose()
    _no_markers(_folder_bytes(tmp_path))
    _no_markers(_rows_except(db, ''))  # message bodies decompressed, media blobs included

    reopened = SqliteStepStore(database=db, encryption=encryption)
    try:
        await _check_round_trip(reopened, run_id)
    finally:
        await reopened.aclose()


async def test_the_checks_find_markers_in_an_unencrypted_store(tmp_path: Path) -> None:
    """The test above would see the markers if they were stored: without encryption they are."""
    store = FileStepStore(tmp_path / 'runs', media_store=None)
    await _run(store)
    await store.aclose()
    raw = _folder_bytes(tmp_path)
    assert PROMPT_MARKER.encode() in raw
    assert TOOL_MARKER.encode() in raw


async def test_file_store_stores_nothing_in_clear(tmp_path: Path, encryption: Encryption) -> None:
    store = FileStepStore(tmp_path / 'runs', encryption=encryption)
    run_id = await _run(store)
    await store.aclose()
    _no_markers(_folder_bytes(tmp_path))
    reopened = FileStepStore(tmp_path / 'runs', encryption=encryption)
    await _check_round_trip(reopened, run_id)
    await reopened.aclose()


@pytest.fixture
async def postgres_prefix() -> AsyncIterator[tuple[str, str]]:
    url = os.environ.get('STEP_POSTGRES_URL', '').strip()
    if not url:
        pytest.fail('STEP_POSTGRES_URL is not set: start a server with `scripts/postgres-server.sh start`')
    prefix = f'enc_{uuid.uuid4().hex[:10]}'
    yield url, prefix
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        rows = await conn.execute('SELECT tablename FROM pg_tables WHERE tablename LIKE %s', (prefix + '%',))
        for (table,) in await rows.fetchall():
            await conn.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')


async def test_postgres_rows_hold_nothing_in_clear(postgres_prefix: tuple[str, str], encryption: Encryption) -> None:
    url, prefix = postgres_prefix
    store = PostgresStepStore(dsn=url, table_prefix=prefix, encryption=encryption)
    try:
        run_id = await _run(store)
        await _check_round_trip(store, run_id)
    finally:
        await store.aclose()
    raw = b''
    async with await psycopg.AsyncConnection.connect(url) as conn:
        tables = await (
            await conn.execute('SELECT tablename FROM pg_tables WHERE tablename LIKE %s', (prefix + '%',))
        ).fetchall()
        for (table,) in tables:
            for (row,) in await (await conn.execute(f'SELECT t::text FROM "{table}" t')).fetchall():
                raw += row.encode() + b'\n'
            for (blob,) in await (
                await conn.execute(
                    f"SELECT string_agg(encode(convert_to(t::text, 'UTF8'), 'escape'), '') FROM \"{table}\" t"
                )
            ).fetchall():
                raw += (blob or '').encode()
    assert run_id.encode() in raw, 'the rows were read'
    _no_markers(raw)
    # bytea columns show as hex in text: look for the markers' hex too
    for marker in MARKERS:
        assert marker.hex() not in raw.decode(errors='replace')


async def test_a_missing_or_wrong_key_is_an_error_naming_the_key_id(tmp_path: Path, encryption: Encryption) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db, encryption=encryption)
    run_id = await _run(store)
    await store.aclose()

    attempts: list[tuple[str, Callable[[], StepStore]]] = [
        ('no keys', lambda: SqliteStepStore(database=db)),
        ('another key id', lambda: SqliteStepStore(database=db, encryption=Encryption(keys={'k2': generate_key()}))),
        (
            'other bytes under k1',
            lambda: SqliteStepStore(database=db, encryption=Encryption(keys={'k1': generate_key()})),
        ),
    ]
    for what, make in attempts:
        other = make()
        try:
            reads: list[Callable[[StepStore], Awaitable[object]]] = [
                lambda s: s.get_run(run_id),
                lambda s: s.list_runs(),
                lambda s: s.latest_snapshot(run_id),
                lambda s: s.list_events(run_id),
                lambda s: s.list_tool_effects(run_id),
            ]
            for read in reads:
                with pytest.raises(EncryptionKeyError, match="'k1'") as caught:
                    await read(other)
                assert caught.value.key_id == 'k1', what
        finally:
            await other.aclose()


async def test_a_tampered_ciphertext_is_damage(tmp_path: Path, encryption: Encryption) -> None:
    import sqlite3

    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db, encryption=encryption)
    run_id = await _run(store)
    await store.aclose()
    with sqlite3.connect(db) as raw:
        (body,) = raw.execute('SELECT record FROM runs WHERE run_id = ?', (run_id,)).fetchone()
        text = body if isinstance(body, str) else body.decode()
        cut = text.index('"e":"') + 10
        tampered = text[:cut] + ('A' if text[cut] != 'A' else 'B') + text[cut + 1 :]
        raw.execute('UPDATE runs SET record = ? WHERE run_id = ?', (tampered, run_id))
    reopened = SqliteStepStore(database=db, encryption=encryption)
    try:
        with pytest.raises(DamagedRecordError, match='integrity check'):
            await reopened.get_run(run_id)
    finally:
        await reopened.aclose()


async def test_keys_for_a_url_come_from_the_environment_or_a_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = generate_key()
    monkeypatch.setenv('TEST_STEP_KEYS', Encryption.key_text('k1', key))
    db = tmp_path / 'runs.db'
    store = open_store(f'sqlite:///{db}?encryption_env=TEST_STEP_KEYS')
    run_id = await _run(store)
    await store.aclose()
    _no_markers(_folder_bytes(tmp_path))

    key_file = tmp_path / 'keys.txt'
    key_file.write_text(f'# rotated\n{Encryption.key_text("k1", key)}\n')
    reopened = open_store(f'sqlite:///{db}', encryption_key_file=str(key_file))
    try:
        await _check_round_trip(reopened, run_id)
    finally:
        await reopened.aclose()
    with pytest.raises(ValueError, match='never key text'):
        open_store(f'sqlite:///{db}?encryption=k1%3Dabc')


def test_encryption_options_are_checked() -> None:
    with pytest.raises(ValueError, match='at least one key'):
        Encryption(keys={})
    with pytest.raises(ValueError, match="'k1' must be 16, 24 or 32 bytes"):
        Encryption(keys={'k1': b'short'})
    with pytest.raises(ValueError, match='active='):
        Encryption(keys={'a': generate_key(), 'b': generate_key()})
    with pytest.raises(ValueError, match="active='c'"):
        Encryption(keys={'a': generate_key()}, active='c')
    both = Encryption.from_text(
        f'{Encryption.key_text("old", generate_key())};{Encryption.key_text("new", generate_key())};active=new'
    )
    assert both.active == 'new'
    assert both.key_ids == ['new', 'old']
    assert 'new' in repr(both)
    assert 'bytes' not in repr(both)
    with pytest.raises(ValueError, match='not valid base64'):
        Encryption.from_text('k1=%%%')


def test_rekey_rewrites_every_run_under_the_active_key_and_resumes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from stepcore.cli import app
    from stepcore.cli._loop import run_coroutine

    db = tmp_path / 'runs.db'
    first, second = run_coroutine(_two_runs_in_clear(db))
    old, new = generate_key(), generate_key()
    keys = tmp_path / 'keys.txt'
    keys.write_text(Encryption.key_text('k1', old) + '\n')
    journal = tmp_path / 'journal'
    result = CliRunner().invoke(
        app, ['rekey', '--store', f'sqlite:///{db}', '--key-file', str(keys), '--journal', str(journal)]
    )
    assert result.exit_code == 0, result.output
    assert 'rewrote 2 run(s)' in result.stderr
    # every row of the step tables is under the key; the media blobs written in clear stay in the
    # media table until it is cleaned (the rewrite stores them again, encrypted)
    _no_markers(_rows_except(db, 'media'))
    run_coroutine(_rotate_and_resume(db, journal, old, new, first, second))


async def _two_runs_in_clear(db: Path) -> tuple[str, str]:
    store = SqliteStepStore(database=db)
    try:
        first, second = await _run(store), await _run(store)
        assert await store.stored_key_ids(first) == {None}
    finally:
        await store.aclose()
    return first, second


async def _rotate_and_resume(db: Path, journal: Path, old: bytes, new: bytes, first: str, second: str) -> None:
    import json

    from stepcore.cli.rekey import rekey_store
    from stepcore.cli.transfer import collect_run, dump_export

    # rotate: k2 becomes active, k1 stays to read what it wrote
    both = Encryption(keys={'k1': old, 'k2': new}, active='k2')
    store = SqliteStepStore(database=db, encryption=both)
    try:
        assert await store.stored_key_ids(first) == {'k1'}
        # a rekey stopped between deleting a run and writing it back leaves it in the journal
        export = await collect_run(store, first)
        journal.joinpath('stopped.rekey').write_bytes(both.seal_blob(json.dumps(dump_export([export])).encode()))
        await store.delete_run(first)
        report = await rekey_store(store, journal)
        assert report.resumed == [first]
        assert sorted(report.rewritten) == sorted([first, second])
        assert await store.stored_key_ids(first) == {'k2'}
        assert await store.stored_key_ids(second) == {'k2'}
        again = await rekey_store(store, journal)
        assert (again.rewritten, again.skipped) == ([], 2)
        assert not list(journal.iterdir())
    finally:
        await store.aclose()

    only_new = SqliteStepStore(database=db, encryption=Encryption(keys={'k2': new}))
    try:
        await _check_round_trip(only_new, first)
        await _check_round_trip(only_new, second)
    finally:
        await only_new.aclose()
