"""The engine's own mechanisms, seen through ports that misbehave on purpose."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from stepcore import (
    ContinuableSnapshot,
    DamagedRecordError,
    InMemoryStepStore,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.engine import KeyConflict, ops
from stepcore.engine.memory import MemoryPort
from stepcore.store.models import EventKind


def history(steps: int) -> list[ModelMessage]:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    for n in range(steps):
        messages.append(ModelResponse(parts=[TextPart(f'answer {n}')]))
        messages.append(ModelRequest(parts=[UserPromptPart(f'more {n}')]))
    return messages


class _FailingPort(MemoryPort):
    """Raises an operating-system error from one operation."""

    def __init__(self, failing: str) -> None:
        super().__init__()
        self.failing = failing

    def put_events(self, tx: Any, op: ops.PutEvents) -> None:
        if self.failing == 'put_events':
            raise OSError(28, 'No space left on device')
        super().put_events(tx, op)

    def list_runs(self, tx: Any, op: ops.ListRuns) -> list[ops.RunRow]:
        if self.failing == 'list_runs':
            raise OSError(5, 'Input/output error')
        return super().list_runs(tx, op)


def _store(port: MemoryPort) -> InMemoryStepStore:
    store = InMemoryStepStore()
    store.port = port
    return store


async def test_a_backend_error_carries_a_note_naming_the_store_and_the_run() -> None:
    store = _store(_FailingPort('put_events'))
    with pytest.raises(OSError, match='No space left') as caught:
        await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, step_index=0))
    assert caught.value.__notes__ == ["InMemoryStepStore on process memory, writing run 'r1'"]
    store = _store(_FailingPort('list_runs'))
    with pytest.raises(OSError, match='Input/output') as caught:
        await store.list_runs()
    assert caught.value.__notes__ == ['InMemoryStepStore on process memory, listing runs']


async def test_errors_of_the_contract_get_no_note() -> None:
    store = InMemoryStepStore()
    await store.register_run(RunRecord(run_id='r1'))
    with pytest.raises(ValueError, match='is already in the store') as caught:
        await store.register_run(RunRecord(run_id='r1'))
    assert not hasattr(caught.value, '__notes__')


@pytest.mark.parametrize('run_id', ['', 'with\x00nul', 17])
async def test_a_run_id_that_cannot_be_stored_is_named(run_id: Any) -> None:
    store = InMemoryStepStore()
    with pytest.raises(ValueError, match=r'run_id .* cannot be stored: use a non-empty string without NUL'):
        await store.get_run(run_id)


class _Unreadables(MemoryPort):
    """Hands over the row of run 'bad' as a body it could not read."""

    @staticmethod
    def _spoil(row: ops.RunRow) -> ops.RunRow:
        if row.run_id != 'bad':
            return row
        return ops.RunRow(
            row.run_id, row.started_at, row.conversation_id, row.parent_run_id, ops.Unreadable('disk said no')
        )

    def list_runs(self, tx: Any, op: ops.ListRuns) -> list[ops.RunRow]:
        return [self._spoil(r) for r in super().list_runs(tx, op)]

    def get_run(self, tx: Any, op: ops.GetRun) -> ops.RunRow | None:
        row = super().get_run(tx, op)
        return self._spoil(row) if row is not None else None


async def test_an_unreadable_body_is_a_damaged_record_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    store = _store(_Unreadables())
    for run_id in ('good', 'bad'):
        await store.register_run(RunRecord(run_id=run_id))
    assert [r.run_id for r in await store.list_runs()] == ['good']
    assert "skipping an unreadable record: run record of run 'bad' in process memory is unreadable: disk said no" in (
        caplog.text
    )
    with pytest.raises(DamagedRecordError, match='is unreadable: disk said no') as raised:
        await store.get_run('bad')
    assert raised.value.kind == 'unreadable'


class _Unparsables(MemoryPort):
    """Hands over every run row as a body whose framing it could not take apart."""

    def list_runs(self, tx: Any, op: ops.ListRuns) -> list[ops.RunRow]:
        return [
            ops.RunRow(r.run_id, r.started_at, r.conversation_id, r.parent_run_id, ops.Unparsable('torn envelope'))
            if r.run_id == 'bad'
            else r
            for r in super().list_runs(tx, op)
        ]


async def test_an_unparsable_body_is_a_damaged_record_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    store = _store(_Unparsables())
    for run_id in ('good', 'bad'):
        await store.register_run(RunRecord(run_id=run_id))
    assert [r.run_id for r in await store.list_runs()] == ['good']
    assert "skipping an unparsable record: run record of run 'bad' in process memory is unparsable" in caplog.text
    assert 'ValueError: torn envelope' in caplog.text


class _OldBodies(MemoryPort):
    """Hands over the run record and ledger entries of run 'old' as bodies of record format 1 (no
    checksum), with the fields given, as a store written before checksums might hold them."""

    def __init__(self, run: dict[str, Any], effect: dict[str, Any], status: str) -> None:
        super().__init__()
        self.run_fields = run
        self.effect_fields = effect
        self.status = status

    def get_run(self, tx: Any, op: ops.GetRun) -> ops.RunRow | None:
        row = super().get_run(tx, op)
        if row is None or row.run_id != 'old':
            return row
        return ops.RunRow(
            row.run_id, row.started_at, row.conversation_id, row.parent_run_id, {'format': 1, **self.run_fields}
        )

    def list_effects(self, tx: Any, op: ops.ListEffects) -> list[ops.EffectRow]:
        return [
            ops.EffectRow(r.run_id, r.tool_call_id, self.status, r.started_at, {'format': 1, **self.effect_fields})
            if r.run_id == 'old'
            else r
            for r in super().list_effects(tx, op)
        ]


async def _old_run(port: _OldBodies) -> InMemoryStepStore:
    store = _store(port)
    await store.register_run(RunRecord(run_id='old'))
    await store.record_tool_effect(
        ToolEffectRecord(run_id='old', tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
    )
    return store


async def test_a_record_whose_fields_do_not_validate_says_it_has_wrong_types() -> None:
    store = await _old_run(_OldBodies({'registration_id': 5}, {'tool_call_id': 'c', 'tool_name': None}, 'started'))
    with pytest.raises(DamagedRecordError) as raised:
        await store.get_run('old')
    reason = 'run record has wrong types: registration_id: Input should be a valid string (found 5)'
    assert raised.value.reason == reason
    assert str(raised.value) == f"run record of run 'old' in process memory is unparsable: {reason}"
    with pytest.raises(DamagedRecordError) as raised:
        await store.get_tool_effect('old', 'c')
    reason = 'tool effect record has wrong types: tool_name: Input should be a valid string (found None)'
    assert raised.value.reason == reason


async def test_a_ledger_status_that_is_no_known_status_is_named() -> None:
    store = await _old_run(_OldBodies({}, {'tool_call_id': 'c', 'tool_name': 't', 'status': 'sent'}, 'sent'))
    with pytest.raises(DamagedRecordError) as raised:
        await store.list_tool_effects('old')
    assert raised.value.reason == "unknown tool effect status: 'sent' (known: 'started', 'completed' or 'failed')"
    # a port that could not read the status hands it over as '': the body's value is named
    store = await _old_run(_OldBodies({}, {'tool_call_id': 'c', 'tool_name': 1, 'status': 'sent'}, ''))
    with pytest.raises(DamagedRecordError) as raised:
        await store.list_tool_effects('old')
    assert raised.value.reason == (
        "unknown tool effect status: 'sent' (known: 'started', 'completed' or 'failed'); "
        'tool effect record has wrong types: tool_name: Input should be a valid string (found 1)'
    )
    # and one the body does not have at all is missing
    store = await _old_run(_OldBodies({}, {'tool_call_id': 'c', 'tool_name': 't'}, ''))
    with pytest.raises(DamagedRecordError) as raised:
        await store.list_tool_effects('old')
    assert raised.value.reason == 'tool effect record has wrong types: status: missing'


class _Racing(MemoryPort):
    """Another writer records the snapshot key between the engine's check and its write, `races` times."""

    def __init__(self, races: int) -> None:
        super().__init__()
        self.races = races

    def put_snapshot(self, tx: Any, op: ops.PutSnapshot) -> list[int]:
        if self.races and op.key is not None:
            self.races -= 1
            raise KeyConflict(op.key)
        return super().put_snapshot(tx, op)


async def test_a_key_conflict_runs_the_save_again() -> None:
    store = _store(_Racing(races=2))
    messages = history(1)
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', messages=messages, idempotency_key='k', step_index=0))
    assert [s.messages for s in await store.list_snapshots('r1')] == [messages]


async def test_a_key_that_keeps_conflicting_is_an_error_naming_it() -> None:
    store = _store(_Racing(races=100))
    snapshot = ContinuableSnapshot(run_id='r1', messages=history(1), idempotency_key='k', step_index=0)
    with pytest.raises(RuntimeError, match="snapshot key 'k' of run 'r1' kept conflicting"):
        await store.save_snapshot(snapshot)


async def test_a_history_whose_base_is_gone_is_written_whole() -> None:
    store = InMemoryStepStore()
    messages = history(3)
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', messages=messages[:5], step_index=0))
    # The run's messages vanish behind the store's back (another process deleted it).
    port = store.port
    assert isinstance(port, MemoryPort)
    port._data.clear()  # pyright: ignore[reportPrivateUsage]
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', messages=messages, step_index=0))
    latest = await store.latest_snapshot('r1')
    assert latest is not None
    assert latest.messages == messages


async def test_a_missing_message_node_is_named_when_read() -> None:
    store = InMemoryStepStore()
    await store.save_snapshot(ContinuableSnapshot(run_id='r1', messages=history(2), step_index=0))
    port = store.port
    assert isinstance(port, MemoryPort)
    nodes = port._data['r1'].nodes  # pyright: ignore[reportPrivateUsage]
    del nodes[sorted(nodes)[1]]
    with pytest.raises(DamagedRecordError, match=r"snapshot seq=1 of run 'r1' .* message node \d+ is missing"):
        await store.latest_snapshot('r1')
    assert await store.list_snapshots('r1') == []


class _RepeatingPort(MemoryPort):
    """Lists one snapshot (or event) twice in place of the one after it, as a damaged index can."""

    def list_snapshots(self, tx: Any, op: ops.ListSnapshots) -> list[ops.SnapshotRow]:
        rows = super().list_snapshots(tx, op)
        return [rows[0], rows[0], *rows[2:]] if len(rows) > 1 else rows

    def list_events(self, tx: Any, op: ops.ListEvents) -> list[ops.EventRow]:
        rows = super().list_events(tx, op)
        return [rows[1], rows[0], *rows[2:]] if len(rows) > 1 else rows


async def test_a_listing_that_repeats_or_reorders_rows_is_damage_naming_the_run() -> None:
    store = _store(_RepeatingPort())
    await store.register_run(RunRecord(run_id='r1'))
    for step in range(2):
        await store.save_snapshot(
            ContinuableSnapshot(run_id='r1', step_index=step, state='complete', messages=history(step + 1))
        )
        await store.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, step_index=step))
    with pytest.raises(DamagedRecordError, match='seq 1 is listed twice') as caught:
        await store.list_snapshots(run_id='r1')
    assert caught.value.run_id == 'r1'
    with pytest.raises(DamagedRecordError, match='seq 1 is listed twice'):
        await store.list_snapshot_summaries('r1')
    with pytest.raises(DamagedRecordError, match='seq 1 is listed after seq 2') as caught:
        await store.list_events('r1')
    assert caught.value.run_id == 'r1'
