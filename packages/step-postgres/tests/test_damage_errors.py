"""PostgreSQL's own words for damaged data become `DamagedRecordError` naming the run read."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import errors

from step_postgres import PostgresStepStore
from stepcore import DamagedRecordError, RunRecord, StepEvent
from stepcore.store.models import EventKind


@pytest.mark.parametrize('error', [errors.DataCorrupted('invalid page in block 7'), errors.IndexCorrupted('bad')])
async def test_a_corruption_error_while_reading_names_the_run(
    postgres_url: str, table_prefix: str, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    try:
        await store.register_run(RunRecord(run_id='r1'))
        await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, step_index=0))

        async def corrupted(*args: Any) -> Any:
            raise error

        # the port sends its reads through one pipeline: the server's error surfaces there
        monkeypatch.setattr(store.port, 'fetch', corrupted)
        with pytest.raises(DamagedRecordError) as caught:
            await store.list_events('r1')
        assert caught.value.run_id == 'r1'
        assert type(error).__name__ in str(caught.value)
    finally:
        await store.aclose()


def test_other_driver_errors_are_not_taken_for_damage(postgres_url: str, table_prefix: str) -> None:
    port = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix).port
    assert port.damage_of(errors.UniqueViolation('duplicate')) is None
    assert port.damage_of(errors.DataCorrupted('invalid page')) is not None
