"""The stored record models."""

from __future__ import annotations

from datetime import UTC, timedelta

from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.store.models import utcnow


def test_utcnow_is_aware_utc() -> None:
    now = utcnow()
    assert now.tzinfo is not None
    assert now.utcoffset() == timedelta(0)
    assert now.tzinfo is UTC


def test_defaults() -> None:
    run = RunRecord(run_id='r')
    assert (run.agent_name, run.conversation_id, run.parent_run_id, run.registration_id) == (None, None, None, None)
    assert run.metadata == {}
    assert run.started_at.tzinfo is not None
    event = StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0)
    assert (event.step_index, event.seq, event.idempotency_key, event.error) == (0, None, None, None)
    snapshot = ContinuableSnapshot(run_id='r', step_index=0, messages=[])
    assert (snapshot.messages, snapshot.state, snapshot.seq) == ([], SnapshotState.COMPLETE, None)
    effect = ToolEffectRecord(run_id='r', tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
    assert effect.status is ToolEffectStatus.STARTED
    assert effect.args is None


def test_mutable_defaults_are_not_shared() -> None:
    a, b = RunRecord(run_id='a'), RunRecord(run_id='b')
    a.metadata['k'] = 'v'
    assert b.metadata == {}
    s1, s2 = (
        ContinuableSnapshot(run_id='a', step_index=0, messages=[]),
        ContinuableSnapshot(run_id='b', step_index=0, messages=[]),
    )
    s1.metadata['k'] = 'v'
    assert s2.metadata == {}
    assert s1.messages is not s2.messages


def test_enum_values_are_the_stored_strings() -> None:
    assert [k.value for k in EventKind] == [
        'run_started',
        'run_completed',
        'run_failed',
        'model_request_started',
        'model_request_completed',
        'model_request_failed',
        'tool_call_started',
        'tool_call_completed',
        'tool_call_failed',
    ]
    assert [s.value for s in SnapshotState] == ['complete', 'interrupted']
    assert [s.value for s in ToolEffectStatus] == ['started', 'completed', 'failed']


def test_records_parse_their_json_form_and_ignore_unknown_fields() -> None:
    event = StepEvent(
        run_id='r', kind=EventKind.TOOL_CALL_FAILED, tool_name='t', error='boom', metadata={'a': 'b'}, step_index=0
    )
    data = event.model_dump(mode='json')
    assert data['kind'] == 'tool_call_failed'
    assert StepEvent.model_validate({**data, 'added_in_a_later_release': 1}) == event
    snapshot = ContinuableSnapshot(run_id='r', state=SnapshotState.INTERRUPTED, step_index=0, messages=[])
    assert ContinuableSnapshot.model_validate(snapshot.model_dump(mode='json')) == snapshot


def test_unresolved_is_true_only_for_started() -> None:
    effect = ToolEffectRecord(run_id='r', tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
    assert effect.unresolved
    for status in (ToolEffectStatus.COMPLETED, ToolEffectStatus.FAILED):
        assert not effect.model_copy(update={'status': status}).unresolved


def test_tool_effect_args_keep_any_json() -> None:
    args = {'list': [1, 'two', None], 'nested': {'x': 1.5, 'flag': True}}
    effect = ToolEffectRecord(run_id='r', tool_call_id='c', tool_name='t', args=args, status=ToolEffectStatus.STARTED)
    assert ToolEffectRecord.model_validate_json(effect.model_dump_json()).args == args
