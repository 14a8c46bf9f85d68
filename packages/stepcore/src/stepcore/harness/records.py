"""pydantic-ai-harness records as stepcore's.

The harness's runs, events, snapshots and ledger entries have the fields of ours under the same
names; a ledger entry's `updated_at`, which the harness does not keep, is its `ended_at` (unset
while the call is in flight), else its `started_at`. Fields a harness release did not write yet
(`state`, `idempotency_key`, `registration_id`) read as the harness reads them: `complete`,
`None`, `None`. A naive timestamp is taken as UTC.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic_ai.messages import ModelMessage

from stepcore.store.models import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord

__all__ = ('effect_from_harness', 'event_from_harness', 'run_from_harness', 'snapshot_from_harness')

R = TypeVar('R', RunRecord, StepEvent, ContinuableSnapshot, ToolEffectRecord)


def _metadata(value: object) -> object:
    """A metadata mapping, from a SQLite column (JSON text) or a file (already parsed); `None` is empty."""
    if value is None:
        return {}
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value


def _aware(record: R) -> R:
    """`record` with each naive datetime field taken as UTC."""
    naive = {
        name: value.replace(tzinfo=UTC)
        for name, value in ((spec.name, getattr(record, spec.name)) for spec in dataclasses.fields(record))
        if isinstance(value, datetime) and value.tzinfo is None
    }
    return record.model_copy(update=naive) if naive else record


def run_from_harness(data: Mapping[str, Any]) -> RunRecord:
    """A harness run record (a `runs` row or a `run.json`) as a `RunRecord`."""
    return _aware(RunRecord.model_validate({**data, 'metadata': _metadata(data.get('metadata'))}))


def event_from_harness(data: Mapping[str, Any]) -> StepEvent:
    """A harness step event as a `StepEvent` (its store-assigned `seq` is left for the target to assign)."""
    fields = {key: value for key, value in data.items() if key != 'seq'}
    return _aware(StepEvent.model_validate({**fields, 'metadata': _metadata(data.get('metadata'))}))


def snapshot_from_harness(data: Mapping[str, Any], messages: list[ModelMessage]) -> ContinuableSnapshot:
    """A harness snapshot's fields (without its history) and its decoded history as a `ContinuableSnapshot`."""
    fields = {key: value for key, value in data.items() if key not in ('seq', 'messages')}
    fields['state'] = fields.get('state') or 'complete'
    fields['messages'] = []
    header = _aware(ContinuableSnapshot.model_validate(fields))
    return header.model_copy(update={'messages': messages})


def effect_from_harness(data: Mapping[str, Any]) -> ToolEffectRecord:
    """A harness ledger entry as a `ToolEffectRecord`."""
    fields = dict(data)
    return _aware(ToolEffectRecord.model_validate(fields))
