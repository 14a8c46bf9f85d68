"""`PRAGMA fullfsync` and `checkpoint_fullfsync` on macOS (simulated on any system): on whenever the
store's `synchronous` level syncs at all, off with `full_fsync=False`, untouched elsewhere."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from step_sqlite import SqliteMediaStore, SqliteStepStore
from step_sqlite.connection import Synchronous
from stepcore import RunRecord


class Opened:
    """The connections the store opens, with the statements run on each."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.connections: list[sqlite3.Connection] = []
        self.statements: list[str] = []
        real_connect = sqlite3.connect

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            connection = real_connect(*args, **kwargs)
            connection.set_trace_callback(self.statements.append)
            self.connections.append(connection)
            return connection

        monkeypatch.setattr(sqlite3, 'connect', connect)  # as the store's connection module calls it

    def pragmas(self) -> list[str]:
        return [s for s in self.statements if 'fullfsync' in s]

    def values(self) -> tuple[int, int]:
        [connection] = self.connections
        full = connection.execute('PRAGMA fullfsync').fetchone()[0]
        checkpoint = connection.execute('PRAGMA checkpoint_fullfsync').fetchone()[0]
        return full, checkpoint


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Opened:
    return Opened(monkeypatch)


async def _use(store: SqliteStepStore) -> None:
    await store.register_run(RunRecord(run_id='r'))
    assert await store.get_run('r') is not None
    await store.aclose()


@pytest.mark.parametrize('synchronous', ['NORMAL', 'FULL', 'EXTRA'])
async def test_darwin_turns_fullfsync_on(
    opened: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synchronous: Synchronous
) -> None:
    monkeypatch.setattr(sys, 'platform', 'darwin')
    store = SqliteStepStore(database=tmp_path / 'runs.db', synchronous=synchronous)
    await store.register_run(RunRecord(run_id='r'))
    assert opened.pragmas() == ['PRAGMA fullfsync=ON', 'PRAGMA checkpoint_fullfsync=ON']
    assert opened.values() == (1, 1)
    await store.aclose()


async def test_darwin_full_fsync_false_turns_it_off(
    opened: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, 'platform', 'darwin')
    store = SqliteStepStore(database=tmp_path / 'runs.db', synchronous='FULL', full_fsync=False)
    await store.register_run(RunRecord(run_id='r'))
    assert opened.pragmas() == ['PRAGMA fullfsync=OFF', 'PRAGMA checkpoint_fullfsync=OFF']
    assert opened.values() == (0, 0)
    await store.aclose()


async def test_darwin_synchronous_off_syncs_nothing_to_flush(
    opened: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, 'platform', 'darwin')
    await _use(SqliteStepStore(database=tmp_path / 'runs.db', synchronous='OFF'))
    assert opened.pragmas() == []


async def test_linux_is_unchanged(opened: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, 'platform', 'linux')
    await _use(SqliteStepStore(database=tmp_path / 'runs.db', synchronous='FULL'))
    assert opened.pragmas() == []
    assert any(s == 'PRAGMA synchronous=FULL' for s in opened.statements)


async def test_full_fsync_true_asks_for_it_anywhere(
    opened: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, 'platform', 'linux')
    await _use(SqliteStepStore(database=tmp_path / 'runs.db', full_fsync=True))
    assert opened.pragmas() == ['PRAGMA fullfsync=ON', 'PRAGMA checkpoint_fullfsync=ON']


async def test_the_media_store_takes_the_option_too(
    opened: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, 'platform', 'darwin')
    media = SqliteMediaStore(database=tmp_path / 'media.db', full_fsync=False)
    uri = await media.put(b'bytes')
    assert await media.get(uri) == b'bytes'
    assert opened.pragmas() == ['PRAGMA fullfsync=OFF', 'PRAGMA checkpoint_fullfsync=OFF']
    await media.aclose()


async def test_a_shared_connection_is_left_as_configured(
    opened: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, 'platform', 'darwin')
    connection = sqlite3.connect(tmp_path / 'runs.db', check_same_thread=False, isolation_level=None)
    try:
        connection.set_trace_callback(opened.statements.append)
        store = SqliteStepStore(connection=connection, full_fsync=True)
        await store.register_run(RunRecord(run_id='r'))
        await store.aclose()
        assert opened.pragmas() == []
        assert connection.execute('PRAGMA fullfsync').fetchone()[0] == 0
    finally:
        connection.close()


def test_full_fsync_must_be_a_bool_or_none(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="full_fsync='on' must be True, False or None"):
        SqliteStepStore(database=tmp_path / 'runs.db', full_fsync='on')  # type: ignore[arg-type]
