"""Damaged documents, made with the conformance kit's damage hook, and how each read treats them."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_mongo.client import MongoClient
from step_mongo.store import MongoStepStore
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.engine import DamagedRecordError

Damage = Callable[[MongoStepStore, str, str, int | str | None, bytes], Awaitable[None]]

NOT_AN_EVENT = b'{"format":1,"kind":17}'
NOT_A_LEDGER_ENTRY = b'{"format":1,"kind":17}'  # no tool_name
NOT_A_RUN = b'{"format":1,"started_at":"not a time"}'
NOT_A_SNAPSHOT = b'{"format":1,"step_index":"not a number"}'
NOT_A_MESSAGE = b'{"format":1,"kind":17}'
MARKER = 'DAMAGE-THIS-MESSAGE'


@pytest.fixture
async def store(mongo_client: MongoClient, db_name: str) -> AsyncIterator[MongoStepStore]:
    store = MongoStepStore(client=mongo_client, database=db_name)
    for run_id in ('r1', 'r2', 'r3'):
        await store.register_run(RunRecord(run_id=run_id))
    for kind in (EventKind.RUN_STARTED, EventKind.MODEL_REQUEST_STARTED, EventKind.RUN_COMPLETED):
        await store.append_event(StepEvent(run_id='r1', kind=kind, step_index=0))
    for call in ('c1', 'c2'):
        await store.record_tool_effect(
            ToolEffectRecord(run_id='r1', tool_call_id=call, tool_name='t', status=ToolEffectStatus.STARTED)
        )
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('first')])]
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', step_index=0, messages=history))
    history = [*history, ModelResponse(parts=[TextPart(MARKER)])]
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', step_index=1, messages=history))
    history = [*history, ModelRequest(parts=[UserPromptPart('last')])]
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', step_index=2, messages=history))
    yield store
    await store.aclose()


def _skipped(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == 'stepcore.engine' and r.levelno == logging.WARNING]


async def test_list_events_skips_a_damaged_event_with_a_warning(
    store: MongoStepStore, mongo_damage: Damage, caplog: pytest.LogCaptureFixture
):
    await mongo_damage(store, 'event', 'r1', 2, NOT_AN_EVENT)
    with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
        events = await store.list_events('r1')
    assert [e.seq for e in events] == [1, 3]
    (warning,) = _skipped(caplog)
    assert "event seq=2 of run 'r1'" in warning


async def test_a_damaged_ledger_entry_fails_the_ledger_reads(store: MongoStepStore, mongo_damage: Damage):
    await mongo_damage(store, 'effect', 'r1', 'c2', NOT_A_LEDGER_ENTRY)
    with pytest.raises(DamagedRecordError, match="tool call 'c2' of run 'r1'") as raised:
        await store.list_tool_effects('r1')
    assert raised.value.run_id == 'r1'
    with pytest.raises(DamagedRecordError, match="tool call 'c2'"):
        await store.list_unresolved_tool_effects('r1')
    with pytest.raises(DamagedRecordError, match="tool call 'c2'"):
        await store.get_tool_effect('r1', 'c2')
    intact = await store.get_tool_effect('r1', 'c1')
    assert intact is not None
    assert intact.tool_name == 't'


async def test_a_damaged_snapshot_header_fails_its_read_and_is_skipped_in_the_list(
    store: MongoStepStore, mongo_damage: Damage, caplog: pytest.LogCaptureFixture
):
    await mongo_damage(store, 'snapshot', 'r1', 3, NOT_A_SNAPSHOT)
    with pytest.raises(DamagedRecordError, match="snapshot seq=3 of run 'r1'") as raised:
        await store.latest_snapshot('r1')
    assert raised.value.record == 'snapshot seq=3'
    with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
        listed = await store.list_snapshots('r1', include_interrupted=True)
    assert [s.seq for s in listed] == [1, 2]
    assert len(listed[1].messages) == 2
    (warning,) = _skipped(caplog)
    assert 'snapshot seq=3' in warning


async def test_a_damaged_message_fails_every_snapshot_that_holds_it(
    store: MongoStepStore, mongo_damage: Damage, caplog: pytest.LogCaptureFixture
):
    await mongo_damage(store, 'message', 'r1', MARKER, NOT_A_MESSAGE)
    with pytest.raises(DamagedRecordError, match=r"snapshot seq=3 of run 'r1'.*message 1 \(node 2\) is damaged"):
        await store.latest_snapshot('r1')
    with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
        listed = await store.list_snapshots('r1', include_interrupted=True)
    assert [s.seq for s in listed] == [1]
    assert len(_skipped(caplog)) == 2


async def test_list_runs_skips_only_the_damaged_run(
    store: MongoStepStore, mongo_damage: Damage, caplog: pytest.LogCaptureFixture
):
    await mongo_damage(store, 'run', 'r2', None, NOT_A_RUN)
    with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
        runs = await store.list_runs()
    assert [r.run_id for r in runs] == ['r1', 'r3']
    (warning,) = _skipped(caplog)
    assert "run record of run 'r2'" in warning
    with pytest.raises(DamagedRecordError, match="run record of run 'r2'"):
        await store.get_run('r2')


async def test_the_hook_refuses_a_record_that_is_not_there(store: MongoStepStore, mongo_damage: Damage):
    with pytest.raises(AssertionError, match='no event 9'):
        await mongo_damage(store, 'event', 'r1', 9, NOT_AN_EVENT)
    with pytest.raises(AssertionError, match='no stored message'):
        await mongo_damage(store, 'message', 'r1', 'not in any message', NOT_A_MESSAGE)
