"""SqliteStepStore and SqliteMediaStore against the shared conformance suite."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from step_sqlite import SqliteMediaStore, SqliteStepStore
from step_sqlite.records import pack_body, unpack_body
from stepcore import StepStore
from stepcore_conformance import (
    ConcurrencyConformance,
    Damage,
    EventsConformance,
    HistoryConformance,
    MediaDamage,
    MediaStoreConformance,
    SnapshotsConformance,
    StepStoreConformance,
)

_RECORD_TABLES = {
    'run': ('runs', None),
    'event': ('events', 'seq'),
    'effect': ('tool_effects', 'tool_call_id'),
    'snapshot': ('snapshots', 'seq'),
}
"""Damage kind -> the table holding that record's body (column `record`) and the column naming it."""


def damage_database(database: Path) -> Damage:
    """The kit's damage hook for a store on `database`: overwrites one stored body with plain SQL."""

    async def damage(store: StepStore, kind: str, run_id: str, ident: int | str | None, replacement: bytes) -> None:
        with closing(sqlite3.connect(database)) as connection, connection:
            if kind == 'message':
                rows = connection.execute('SELECT node_id, body FROM message_nodes WHERE run_id = ?', (run_id,))
                marked = [node for node, body in rows if str(ident).encode() in unpack_body(body)]
                assert marked, f'no stored message of {run_id!r} holds {ident!r}'
                connection.executemany(
                    'UPDATE message_nodes SET body = ? WHERE node_id = ?', [(pack_body(replacement), n) for n in marked]
                )
                return
            table, column = _RECORD_TABLES[kind]
            where, params = 'run_id = ?', list[object]([run_id])
            if column is not None:
                where += f' AND {column} = ?'
                params.append(str(ident) if column == 'tool_call_id' else ident)
            changed = connection.execute(
                f'UPDATE {table} SET record = ? WHERE {where}', [replacement.decode(), *params]
            )
            assert changed.rowcount == 1, f'no {kind} {ident!r} stored for {run_id!r} in {table}'

    return damage


class TestSqliteStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(self, tmp_path: Path, store_options: dict[str, Any]) -> AsyncIterator[SqliteStepStore]:
        store = SqliteStepStore(database=tmp_path / 'runs.db', **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, tmp_path: Path) -> dict[str, Any]:
        return {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')}

    @pytest.fixture
    def other_store_spec(self, tmp_path: Path) -> dict[str, Any]:
        return {'backend': 'sqlite', 'database': str(tmp_path / 'other.db')}

    @pytest.fixture
    def damage(self, tmp_path: Path) -> Damage:
        return damage_database(tmp_path / 'runs.db')


class TestSqliteStepStoreOnSharedConnection(
    EventsConformance, SnapshotsConformance, HistoryConformance, ConcurrencyConformance
):
    """The write-path sections again on an application's connection (`check_same_thread=False`)."""

    @pytest.fixture
    def connection(self, tmp_path: Path) -> Iterator[sqlite3.Connection]:
        connection = sqlite3.connect(tmp_path / 'app.db', check_same_thread=False)
        yield connection
        connection.close()

    @pytest.fixture
    async def store(
        self, connection: sqlite3.Connection, store_options: dict[str, Any]
    ) -> AsyncIterator[SqliteStepStore]:
        store = SqliteStepStore(connection=connection, **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, tmp_path: Path) -> dict[str, Any]:
        return {'backend': 'sqlite', 'database': str(tmp_path / 'app.db')}


class TestSqliteMediaStore(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self, tmp_path: Path) -> AsyncIterator[SqliteMediaStore]:
        store = SqliteMediaStore(database=tmp_path / 'media.db')
        yield store
        await store.aclose()

    @pytest.fixture
    def media_damage(self, tmp_path: Path) -> MediaDamage:
        async def damage(store: object, uri: str, replacement: bytes) -> None:
            with closing(sqlite3.connect(tmp_path / 'media.db')) as conn, conn:
                changed = conn.execute(
                    'UPDATE media SET data = ? WHERE digest = ?', (replacement, uri.removeprefix('media+sha256://'))
                ).rowcount
            assert changed == 1, f'no row of {uri} to damage'

        return damage

    @pytest.fixture
    async def gc_step_store(self, tmp_path: Path, media_store: SqliteMediaStore) -> AsyncIterator[SqliteStepStore]:
        """Collection reads the snapshots of a real SQLite step store."""
        store = SqliteStepStore(database=tmp_path / 'runs.db', media_store=media_store, media_threshold_bytes=1024)
        yield store
        await store.aclose()
