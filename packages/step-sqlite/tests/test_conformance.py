"""SqliteStepStore and SqliteMediaStore against the shared conformance suite."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from step_sqlite import SqliteMediaStore, SqliteStepStore
from stepcore_conformance import (
    ConcurrencyConformance,
    EventsConformance,
    HistoryConformance,
    MediaStoreConformance,
    SnapshotsConformance,
    StepStoreConformance,
)


class TestSqliteStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(self, tmp_path: Path, store_options: dict[str, Any]) -> AsyncIterator[SqliteStepStore]:
        store = SqliteStepStore(database=tmp_path / 'runs.db', **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, tmp_path: Path) -> dict[str, Any]:
        return {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')}


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
