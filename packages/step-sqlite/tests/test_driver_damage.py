"""Damage SQLite reports as its own errors is told as `DamagedRecordError`, naming the run read."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from step_sqlite import SqliteStepStore
from stepcore import DamagedRecordError, EventKind, RunRecord, StepEvent


async def _store_with_a_run(db: Path) -> str:
    store = SqliteStepStore(database=db)
    await store.register_run(RunRecord(run_id='run-1', agent_name='a'))
    for index in range(3):
        await store.append_event(StepEvent(run_id='run-1', step_index=index, kind=EventKind.MODEL_REQUEST_STARTED))
    await store.aclose()
    return 'run-1'


async def test_a_record_whose_text_does_not_decode_is_one_damaged_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / 'runs.db'
    run_id = await _store_with_a_run(db)
    with sqlite3.connect(db) as connection:  # invalid UTF-8 in the second event's TEXT column
        connection.execute("UPDATE events SET record = CAST(x'7bff22' AS TEXT) WHERE seq = 2")
    connection.close()
    store = SqliteStepStore(database=db)
    with caplog.at_level(logging.WARNING, logger='stepcore'):
        events = await store.list_events(run_id)
    await store.aclose()
    assert [e.seq for e in events] == [1, 3]  # the listing goes on; the driver no longer fails it whole
    assert any("of run 'run-1'" in r.getMessage() and 'event' in r.getMessage() for r in caplog.records)


async def test_a_malformed_file_is_damage_of_the_run_read(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    run_id = await _store_with_a_run(db)
    data = bytearray(db.read_bytes())
    page = 4096
    for offset in range(page, len(data), page):  # break the header of every page after the first
        data[offset : offset + 8] = b'\xff' * 8
    db.write_bytes(bytes(data))
    store = SqliteStepStore(database=db)
    with pytest.raises(DamagedRecordError) as raised:
        await store.list_events(run_id)
    await store.aclose()
    assert raised.value.run_id == run_id
    assert 'malformed' in str(raised.value)
    assert 'integrity_check' in str(raised.value)
