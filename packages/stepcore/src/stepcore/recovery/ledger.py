"""The ledger as recovery reads and writes it: entries through the contract, settlements as events.

A settlement makes a cut-short call's entry `completed`, its effect summary saying how
(`SUMMARY_MARK`), and appends a `tool_call_completed` event whose metadata carries how (`HOW_KEY`),
the result the call gets (`RESULT_KEY`), and, for an answer a person gave, that it was given by
hand (`BY_HAND_KEY`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, cast

import pydantic_core
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart

from stepcore.store.contract import write_records
from stepcore.store.models import EventKind, StepEvent, ToolEffectRecord, ToolEffectStatus, utcnow
from stepcore.store.step_store import StepStore

__all__ = (
    'BY_HAND_KEY',
    'HOW_KEY',
    'RESULT_KEY',
    'SUMMARY_MARK',
    'Ledger',
    'Recorded',
    'SettledBy',
    'called_in',
    'ledger_of',
    'record_settlements',
    'run_end_event',
    'settlements_of',
)

SettledBy: TypeAlias = Literal['rerun', 'reconciled', 'supplied', 'checked', 'snapshot']
"""How a call cut short was settled: run again, reconciled with the outside world, given a result by
the caller, marked checked by the caller, or found answered in the complete snapshot already."""

HOW_KEY = 'stepcore.settled_by'
"""Metadata key of a settlement event: how the call was settled (`SettledBy`)."""
RESULT_KEY = 'stepcore.result'
"""Metadata key of a settlement event: the result the call gets, as JSON."""
BY_HAND_KEY = 'stepcore.by_hand'
"""Metadata key of a settlement event a person made (`supply_result`, `mark_checked`, `rerun_call`): `'1'`."""

SUMMARY_MARK = ' [settled on recovery: '
"""What an entry's effect summary says, followed by how and `]`, once `resolve_run` or a caller settled it."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """The newest settlement recorded for a call."""

    how: SettledBy
    result: Any
    by_hand: bool


def called_in(messages: Sequence[ModelMessage]) -> set[str]:
    """The ids of the tool calls the responses in `messages` made."""
    return {
        part.tool_call_id
        for message in messages
        if isinstance(message, ModelResponse)
        for part in message.parts
        if isinstance(part, ToolCallPart)
    }


def recorded_of(events: Sequence[StepEvent]) -> dict[str, Recorded]:
    """The newest recorded settlement of each call, from a run's events."""
    found: dict[str, Recorded] = {}
    for event in events:
        how = event.metadata.get(HOW_KEY)
        if how is None or event.tool_call_id is None:
            continue
        raw = event.metadata.get(RESULT_KEY)
        found[event.tool_call_id] = Recorded(
            cast(SettledBy, how), None if raw is None else json.loads(raw), event.metadata.get(BY_HAND_KEY) == '1'
        )
    return found


def settlements_of(events: Sequence[StepEvent]) -> dict[str, tuple[SettledBy, Any]]:
    """The newest recorded settlement (how, result) of each call, from a run's events."""
    return {call: (r.how, r.result) for call, r in recorded_of(events).items()}


async def _entries(store: StepStore, run_id: str, events: Sequence[StepEvent]) -> list[ToolEffectRecord]:
    """Every ledger entry of the run, oldest first, through the contract: the unresolved ones and
    those whose calls the events name."""
    unresolved = {e.tool_call_id: e for e in await store.list_unresolved_tool_effects(run_id=run_id)}
    entries = dict(unresolved)
    for event in events:
        call_id = event.tool_call_id
        if call_id is None or call_id in entries or event.kind is not EventKind.TOOL_CALL_STARTED:
            continue
        entry = await store.get_tool_effect(run_id=run_id, tool_call_id=call_id)
        if entry is not None:
            entries[call_id] = entry
    return sorted(entries.values(), key=lambda e: e.started_at)


@dataclass(frozen=True)
class Ledger:
    """One run's ledger as recovery reads it."""

    run_id: str
    by_id: dict[str, ToolEffectRecord]
    """Its entries by call id, oldest first."""
    recorded: dict[str, Recorded]

    @property
    def settlements(self) -> dict[str, tuple[SettledBy, Any]]:
        return {call: (r.how, r.result) for call, r in self.recorded.items()}


async def ledger_of(store: StepStore, run_id: str) -> Ledger:
    events = await store.list_events(run_id=run_id)
    entries = await _entries(store, run_id, events)
    return Ledger(run_id, {e.tool_call_id: e for e in entries}, recorded_of(events))


def _summary(entry: ToolEffectRecord, how: SettledBy) -> str:
    base = entry.effect_summary or ''
    if SUMMARY_MARK in base:
        base = base[: base.index(SUMMARY_MARK)]
    return f'{base}{SUMMARY_MARK}{how}]'.lstrip()


async def record_settlements(
    store: StepStore, entries: Sequence[tuple[ToolEffectRecord, SettledBy, Any]], *, by_hand: bool = False
) -> None:
    """Record settlements: each entry `completed` (its summary saying how) and an event carrying how and the result."""
    if not entries:
        return
    now = utcnow()
    writes: list[ToolEffectRecord | StepEvent] = []
    for entry, how, result in entries:
        metadata = {HOW_KEY: how}
        if how != 'rerun':
            metadata[RESULT_KEY] = pydantic_core.to_json(result).decode()
        if by_hand:
            metadata[BY_HAND_KEY] = '1'
        writes.append(
            entry.model_copy(
                update={
                    'status': ToolEffectStatus.COMPLETED,
                    'error': None,
                    'ended_at': now,
                    'updated_at': now,
                    'effect_summary': _summary(entry, how),
                }
            )
        )
        writes.append(
            StepEvent(
                run_id=entry.run_id,
                kind=EventKind.TOOL_CALL_COMPLETED,
                step_index=entry.step_index,
                timestamp=now,
                tool_call_id=entry.tool_call_id,
                tool_name=entry.tool_name,
                metadata=metadata,
                idempotency_key=f'recovery:{entry.tool_call_id}:{uuid.uuid4().hex}',
            )
        )
    await write_records(store, writes)


async def run_end_event(
    store: StepStore,
    run_id: str,
    kind: EventKind,
    *,
    metadata: dict[str, str],
    idempotency_key: str,
    error: str | None = None,
) -> StepEvent:
    """An event recovery appends to end a run's trail (`run_completed`, `run_failed`), at the step of the
    run's newest snapshot and with the lineage of its record, as the run itself would have written it."""
    record = await store.get_run(run_id=run_id)
    newest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    return StepEvent(
        run_id=run_id,
        kind=kind,
        step_index=newest.step_index if newest is not None else 0,
        timestamp=utcnow(),
        agent_name=record.agent_name if record is not None else None,
        conversation_id=record.conversation_id if record is not None else None,
        parent_run_id=record.parent_run_id if record is not None else None,
        error=error,
        metadata=metadata,
        idempotency_key=idempotency_key,
    )
