"""A document that no longer decodes as BSON becomes `DamagedRecordError` naming the run read."""

from __future__ import annotations

from typing import Any

import pytest
from bson.errors import InvalidBSON
from pymongo.errors import OperationFailure

from step_mongo import MongoStepStore
from stepcore import DamagedRecordError, RunRecord, StepEvent
from stepcore.store.models import EventKind


async def test_a_document_that_does_not_decode_names_the_run(
    mongo_url: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MongoStepStore(db_url=mongo_url, database=db_name)
    try:
        await store.register_run(RunRecord(run_id='r1'))
        await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, step_index=0))

        async def undecodable(*args: Any) -> Any:
            raise InvalidBSON('bad eoo')

        monkeypatch.setattr(store.port, 'list_events', undecodable)
        with pytest.raises(DamagedRecordError) as caught:
            await store.list_events('r1')
        assert caught.value.run_id == 'r1'
        assert 'InvalidBSON' in str(caught.value)
        assert store.port.damage_of(OperationFailure('not master')) is None
    finally:
        await store.aclose()
