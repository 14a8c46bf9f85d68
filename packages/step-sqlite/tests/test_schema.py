"""Schema versions: fresh databases, in-place upgrades, and refusal of newer layouts."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_sqlite import SqliteMediaStore, SqliteStepStore
from step_sqlite.schema import STEPS
from stepcore import ContinuableSnapshot, RunRecord, SnapshotState
from stepcore.media import StoredMedia, digest_of_uri, media_uri
from stepcore.store.codec import FORMAT_KEY, dump_record, encode_message

# The version-1 layout, written out by hand as an older release created it: snapshots had no
# `state` column (every snapshot was complete).
V1_LAYOUT = """
CREATE TABLE stepcore_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL);
INSERT INTO stepcore_schema VALUES ('steps', 1);
CREATE TABLE runs (run_id TEXT PRIMARY KEY, conversation_id TEXT, parent_run_id TEXT,
                   started_us INTEGER NOT NULL, record TEXT NOT NULL);
CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, idempotency_key TEXT, record TEXT NOT NULL,
                     PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
CREATE UNIQUE INDEX events_idempotency ON events (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE TABLE message_nodes (node_id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, parent_id INTEGER, body BLOB NOT NULL);
CREATE TABLE snapshots (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, head INTEGER,
                        length INTEGER NOT NULL, record TEXT NOT NULL);
CREATE TABLE snapshot_idempotency_keys (run_id TEXT NOT NULL, idempotency_key TEXT NOT NULL,
                                        PRIMARY KEY (run_id, idempotency_key)) WITHOUT ROWID;
CREATE TABLE tool_effects (run_id TEXT NOT NULL, tool_call_id TEXT NOT NULL, status TEXT NOT NULL,
                           started_us INTEGER NOT NULL, record TEXT NOT NULL, UNIQUE (run_id, tool_call_id));
"""


def _version(db: Path, component: str = 'steps') -> int:
    with sqlite3.connect(db) as raw:
        return int(raw.execute('SELECT version FROM stepcore_schema WHERE component = ?', (component,)).fetchone()[0])


def _format_1(record: BaseModel, exclude: set[str] | None = None) -> str:
    """A record as an older release stored it: record format 1, without a checksum."""
    return json.dumps({**dump_record(record, exclude=exclude), FORMAT_KEY: 1})


def _build_v1(db: Path, messages: list[ModelMessage]) -> None:
    raw = sqlite3.connect(db)
    try:
        raw.executescript(V1_LAYOUT)
        run = RunRecord(run_id='old')
        raw.execute('INSERT INTO runs VALUES (?, NULL, NULL, ?, ?)', ('old', 1_700_000_000_000_000, _format_1(run)))
        parent = None
        for node_id, message in enumerate(messages, start=1):
            raw.execute(
                'INSERT INTO message_nodes VALUES (?, ?, ?, ?)', (node_id, 'old', parent, encode_message(message))
            )
            parent = node_id
        header = _format_1(
            ContinuableSnapshot(run_id='old', step_index=4, messages=[]), exclude={'messages', 'seq', 'state'}
        )
        raw.execute(
            'INSERT INTO snapshots (run_id, head, length, record) VALUES (?, ?, ?, ?)',
            ('old', parent, len(messages), header),
        )
        raw.commit()
    finally:
        raw.close()


async def test_a_fresh_database_is_created_at_the_current_version(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db)
    try:
        await store.list_runs()
        assert _version(db) == STEPS.version == 3
        media = store.media_store
        assert isinstance(media, SqliteMediaStore)
        await media.put(b'blob')  # the media table is created on first use
        assert _version(db, 'media:media') == 2
    finally:
        await store.aclose()


async def test_a_version_1_media_table_gets_the_time_of_each_blobs_put(tmp_path: Path) -> None:
    db = tmp_path / 'media.db'
    raw = sqlite3.connect(db)
    try:
        raw.executescript(
            """
            CREATE TABLE stepcore_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL);
            INSERT INTO stepcore_schema VALUES ('media:media', 1);
            CREATE TABLE media (digest TEXT PRIMARY KEY, data BLOB NOT NULL, size INTEGER NOT NULL,
                                media_type TEXT, metadata TEXT, created_at TEXT NOT NULL);
            """
        )
        data = b'stored by an earlier release'
        raw.execute(
            'INSERT INTO media VALUES (?, ?, ?, NULL, NULL, ?)',
            (digest_of_uri(media_uri(data)), data, len(data), '2026-01-02T03:04:05.678901+00:00'),
        )
        raw.commit()
    finally:
        raw.close()
    media = SqliteMediaStore(database=db)
    try:
        assert await media.get(media_uri(data)) == data
        listed = [blob async for blob in media.list_media()]
        assert listed == [
            StoredMedia(uri=media_uri(data), stored_at=datetime(2026, 1, 2, 3, 4, 5, 678901, UTC), size=len(data))
        ]
        assert _version(db, 'media:media') == 2
    finally:
        await media.aclose()


async def test_a_version_1_database_is_upgraded_in_place(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    old_messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart('from an older release')]),
        ModelResponse(parts=[TextPart('still readable')]),
    ]
    _build_v1(db, old_messages)

    store = SqliteStepStore(database=db)
    try:
        old = await store.latest_snapshot('old')
        assert old is not None
        assert (old.step_index, old.state) == (4, SnapshotState.COMPLETE)
        assert old.messages == old_messages
        assert _version(db) == 3
        with sqlite3.connect(db) as raw:
            columns = {r[1] for r in raw.execute('PRAGMA table_info(snapshots)')}
            indexes = {r[1] for r in raw.execute('PRAGMA index_list(snapshots)')}
            (last_node,) = raw.execute('SELECT last FROM node_ids').fetchone()
            (max_node,) = raw.execute('SELECT MAX(node_id) FROM message_nodes').fetchone()
        assert 'state' in columns
        assert 'snapshots_run_state' in indexes
        assert last_node == max_node, 'the node id counter starts after the nodes an older release wrote'

        grown = [*old_messages, ModelRequest(parts=[UserPromptPart('and a new step')])]
        await store.save_snapshot(
            ContinuableSnapshot(run_id='old', step_index=5, messages=grown, state=SnapshotState.INTERRUPTED)
        )
        latest_any = await store.latest_snapshot('old', include_interrupted=True)
        assert latest_any is not None
        assert (latest_any.step_index, latest_any.messages) == (5, grown)
        latest_complete = await store.latest_snapshot('old')
        assert latest_complete is not None
        assert latest_complete.step_index == 4
        run = await store.get_run('old')
        assert run is not None
    finally:
        await store.aclose()


async def test_a_newer_schema_is_refused_with_both_versions_named(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db)
    await store.list_runs()
    await store.aclose()
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE stepcore_schema SET version = 7 WHERE component = 'steps'")

    newer = SqliteStepStore(database=db)
    try:
        with pytest.raises(ValueError, match=r'schema version 7, newer than .*\(version 3\).*upgrade step-sqlite'):
            await newer.list_runs()
    finally:
        await newer.aclose()
    with sqlite3.connect(db) as raw:  # nothing was touched
        assert raw.execute("SELECT version FROM stepcore_schema WHERE component = 'steps'").fetchone()[0] == 7


async def test_a_newer_media_table_is_refused(tmp_path: Path) -> None:
    db = tmp_path / 'media.db'
    media = SqliteMediaStore(database=db)
    uri = await media.put(b'blob')
    await media.aclose()
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE stepcore_schema SET version = 3 WHERE component = 'media:media'")
    again = SqliteMediaStore(database=db)
    try:
        with pytest.raises(ValueError, match=r'schema version 3, newer'):
            await again.get(uri)
    finally:
        await again.aclose()


async def test_tables_of_the_same_name_not_created_by_step_sqlite_are_refused(tmp_path: Path) -> None:
    db = tmp_path / 'app.db'
    with sqlite3.connect(db) as raw:
        raw.execute('CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)')
    store = SqliteStepStore(database=db)
    try:
        with pytest.raises(ValueError, match=r'already has table\(s\) runs that step-sqlite did not create'):
            await store.list_runs()
    finally:
        await store.aclose()
    with sqlite3.connect(db) as raw:
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert 'snapshots' not in tables  # the failed setup rolled back


async def test_an_application_user_version_is_left_alone(tmp_path: Path) -> None:
    db = tmp_path / 'app.db'
    connection = sqlite3.connect(db, check_same_thread=False)
    try:
        connection.execute('PRAGMA user_version = 41')
        store = SqliteStepStore(connection=connection)
        await store.register_run(RunRecord(run_id='r'))
        await store.aclose()
        assert connection.execute('PRAGMA user_version').fetchone()[0] == 41
    finally:
        connection.close()
