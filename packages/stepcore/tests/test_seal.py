"""Sealing a record from its fields gives the very bytes sealing its encoded body gives."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import pytest

from stepcore import EventKind, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.common.encryption import Encryption
from stepcore.engine._seal import Sealer
from stepcore.store.codec import dump_record_compact, record_fields

_WHEN = datetime(2026, 12, 3, 21, 0, 0, 123456, tzinfo=UTC)

RECORDS: list[tuple[Any, dict[str, str]]] = [
    (StepEvent(run_id='r', kind=EventKind.TOOL_CALL_STARTED, timestamp=_WHEN, tool_call_id='c1', step_index=0), {}),
    (
        StepEvent(
            run_id='r', kind=EventKind.RUN_FAILED, timestamp=_WHEN, error='Boom: “ünïcode” \u2028 \\ "q"', step_index=0
        ),
        {},
    ),
    (
        ToolEffectRecord(
            run_id='r',
            tool_call_id='c2',
            tool_name='pay',
            status=ToolEffectStatus.COMPLETED,
            started_at=_WHEN,
            updated_at=_WHEN,
            args={'z': [1, 2.5, 1e300, -0.0, None, True], 'a': {'y': 'é', 'b': {'k': 10**30}}, 'm': 'x</script>'},
        ),
        {},
    ),
    (
        RunRecord(run_id='r', agent_name='agent', started_at=_WHEN, metadata={'tenant': 'acme'}),
        {'h': 'abcdef0123456789'},
    ),
]


@pytest.mark.parametrize(('record', 'extra'), RECORDS)
def test_fields_and_body_seal_the_same(record: Any, extra: dict[str, str]) -> None:
    sealer = Sealer()
    columns = ('r', 'c', 'completed')
    from_body = sealer.record(dump_record_compact(record, exclude={'run_id'}, **extra), columns)
    from_fields = sealer.record(record_fields(record, exclude={'run_id'}, **extra), columns)
    assert from_fields == from_body
    assert sealer.check_record(from_fields, columns)
    assert sealer.open_record(from_fields, frozenset({'run_id'}), columns) == sealer.open_record(
        from_body, frozenset({'run_id'}), columns
    )


def test_an_encrypted_record_sealed_from_fields_opens_to_the_same_fields() -> None:
    sealer = Sealer(Encryption(keys={'k1': os.urandom(32)}))
    record, _ = RECORDS[2]
    columns = ('r', 'c2', 'completed')
    sealed = sealer.record(record_fields(record, exclude={'run_id'}), columns, ('tool_call_id', 'status'))
    assert b'pay' not in sealed  # the tool name is not among the fields kept in clear
    opened = sealer.open_record(sealed, frozenset({'run_id'}), columns)
    assert opened == sealer.open_record(
        Sealer().record(dump_record_compact(record, exclude={'run_id'}), columns), frozenset({'run_id'}), columns
    )


def test_fields_of_another_format_are_refused() -> None:
    with pytest.raises(ValueError, match='format 2'):
        Sealer().record({'format': 1, 'kind': 'run_started'}, ('r',))
