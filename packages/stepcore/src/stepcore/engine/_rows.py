"""The row codec: records into rows (their bodies sealed) and back, naming what is damaged.

A row carries a few columns a backend indexes and a body: the record's other fields, encoded and
stamped with the record format version, with a checksum or encrypted (`_seal.py`). Reading checks
the body against the row's columns and validates the record; a record that does not read raises
`DamagedRecordError` naming the run and the record (`damage.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, cast

from stepcore.common.damage import UnreadableBody, decoded
from stepcore.engine._history import walk_chain
from stepcore.engine._ops import (
    Body,
    EffectRow,
    EventRow,
    Node,
    RunRow,
    SnapshotRow,
    Unparsable,
    Unreadable,
    WriteStep,
)
from stepcore.engine._seal import HEAD_KEY, SEALED_FORMAT, Sealer
from stepcore.store.codec import FORMAT_KEY, validated
from stepcore.store.lifecycle import sort_time
from stepcore.store.models import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord
from stepcore.store.protocols import StepWrite

__all__ = (
    'EFFECT_CLEAR',
    'EFFECT_FIELDS_IN_ROW',
    'EVENT_CLEAR',
    'EVENT_FIELDS_IN_ROW',
    'RUN_CLEAR',
    'RUN_FIELDS_IN_ROW',
    'SNAPSHOT_CLEAR',
    'SNAPSHOT_FIELDS_IN_ROW',
    'RowCodec',
    'open_body',
    'record_rows',
)

RUN_FIELDS_IN_ROW: Final = frozenset({'run_id'})
EVENT_FIELDS_IN_ROW: Final = frozenset({'run_id', 'seq'})
EFFECT_FIELDS_IN_ROW: Final = frozenset({'run_id'})
SNAPSHOT_FIELDS_IN_ROW: Final = frozenset({'run_id', 'seq', 'messages'})
"""Fields a row carries outside its body (the engine fills them back in when reading)."""
RUN_CLEAR: Final = ('started_at', 'conversation_id', 'parent_run_id')
EVENT_CLEAR: Final = ('idempotency_key',)
EFFECT_CLEAR: Final = ('tool_call_id', 'status', 'started_at')
SNAPSHOT_CLEAR: Final = ('state',)
"""Fields an encrypted record keeps in clear beside its ciphertext: what a port indexes, or reads
from the body to find a record (the ciphertext covers them, see `stepcore.engine._seal`)."""


def record_rows(sealer: Sealer, run_id: str, records: Sequence[StepWrite]) -> tuple[list[EventRow], list[EffectRow]]:
    """The rows of one run's events and ledger entries, in order, their bodies sealed."""
    events: list[EventRow] = []
    effects: list[EffectRow] = []
    for record in records:
        if isinstance(record, StepEvent):
            body = sealer.seal(record, EVENT_FIELDS_IN_ROW, (run_id,), EVENT_CLEAR)
            events.append(EventRow(run_id, record.idempotency_key, body))
        else:
            status = record.status.value
            body = sealer.seal(record, EFFECT_FIELDS_IN_ROW, (run_id, record.tool_call_id, status), EFFECT_CLEAR)
            effects.append(
                EffectRow(
                    run_id=run_id,
                    tool_call_id=record.tool_call_id,
                    status=status,
                    started_at=sort_time(record.started_at),
                    body=body,
                )
            )
    return events, effects


def open_body(sealer: Sealer, body: Body, in_row: frozenset[str], sealed_columns: Sequence[object]) -> dict[str, Any]:
    """A record's fields from a row's body, its checksum or ciphertext checked against the row's
    `sealed_columns` (`UnreadableBody` / `ValueError` for a body the port could not read / take
    apart, or that does not check)."""
    if isinstance(body, Unreadable):
        raise UnreadableBody(body.reason)
    if isinstance(body, Unparsable):
        raise ValueError(body.reason)
    return sealer.open_record(body, in_row, sealed_columns)


class RowCodec:
    """Decodes a store's rows into records with its `sealer`; `where()` names the store's data."""

    def __init__(self, sealer: Sealer, where: Callable[[], str]) -> None:
        self.sealer = sealer
        self.where = where

    def run_row(self, record: RunRecord, run_id: str) -> RunRow:
        """The row of a run record (`run_id` checked)."""
        return RunRow(
            run_id=run_id,
            started_at=sort_time(record.started_at),
            conversation_id=record.conversation_id,
            parent_run_id=record.parent_run_id,
            body=self.sealer.seal(record, RUN_FIELDS_IN_ROW, (run_id,), RUN_CLEAR),
        )

    def decode_run(self, row: RunRow) -> RunRecord:
        return decoded(
            lambda: validated(
                RunRecord,
                open_body(self.sealer, row.body, RUN_FIELDS_IN_ROW, (row.run_id,)),
                what='run record',
                run_id=row.run_id,
            ),
            run_id=row.run_id,
            record='run record',
            where=self.where(),
        )

    def decode_event(self, row: EventRow) -> StepEvent:
        return decoded(
            lambda: validated(
                StepEvent,
                open_body(self.sealer, row.body, EVENT_FIELDS_IN_ROW, (row.run_id,)),
                what='event payload',
                kinds={'kind': 'event kind'},
                run_id=row.run_id,
                seq=row.seq,
            ),
            run_id=row.run_id,
            record=f'event seq={row.seq}',
            where=self.where(),
        )

    def decode_effect(self, row: EffectRow) -> ToolEffectRecord:
        return decoded(
            lambda: validated(
                ToolEffectRecord,
                open_body(self.sealer, row.body, EFFECT_FIELDS_IN_ROW, (row.run_id, row.tool_call_id, row.status)),
                what='tool effect record',
                kinds={'status': 'tool effect status'},
                run_id=row.run_id,
                tool_call_id=row.tool_call_id,
                status=row.status,
            ),
            run_id=row.run_id,
            record=f'ledger entry of tool call {row.tool_call_id!r}',
            where=self.where(),
        )

    def checks_as_written(self, body: Body, row: EffectRow) -> bool:
        if isinstance(body, Unreadable | Unparsable) or not isinstance(body, bytes | str):
            return False
        return self.sealer.check_record(body, (row.run_id, row.tool_call_id, row.status))

    def decode_snapshot_header(self, row: SnapshotRow) -> ContinuableSnapshot:
        """A snapshot's fields but its messages."""
        return self.snapshot_header(row)[0]

    def snapshot_header(self, row: SnapshotRow) -> tuple[ContinuableSnapshot, str | None, bool]:
        """A snapshot's fields but its messages, the checksum of its newest message, and whether its
        messages carry checksums (record format 2 and later); `DamagedRecordError` naming it."""

        def read_header() -> tuple[ContinuableSnapshot, str | None, bool]:
            data = open_body(self.sealer, row.body, SNAPSHOT_FIELDS_IN_ROW, (row.run_id, row.state, row.length))
            version = data.get(FORMAT_KEY, 1)
            head = data.pop(HEAD_KEY, None)
            snapshot = validated(
                ContinuableSnapshot,
                data,
                what='snapshot',
                kinds={'state': 'snapshot state'},
                run_id=row.run_id,
                seq=row.seq,
                state=row.state,
                messages=[],
            )
            sealed = isinstance(version, int) and version >= SEALED_FORMAT
            return snapshot, head if isinstance(head, str) else None, sealed

        return decoded(read_header, run_id=row.run_id, record=f'snapshot seq={row.seq}', where=self.where())

    # -- runs ---------------------------------------------------------------------------------

    @staticmethod
    def chain(row: SnapshotRow, nodes: Mapping[int, Node]) -> tuple[list[int], list[bytes]]:
        """The node ids and stored bodies of a snapshot's messages, oldest first (`LookupError` for a lost node)."""
        chain: list[int] = []

        def lookup(node: object) -> Node:
            found = nodes.get(cast(int, node))
            if found is None:
                raise LookupError(f'message node {node} is missing')
            chain.append(cast(int, node))
            return found

        stored = walk_chain(row.head, row.length, lookup)
        chain.reverse()
        return chain, stored


def sealed_size(step: WriteStep) -> int | None:
    """The bytes of the sealed bodies `step` writes, the store's own framing and compression aside;
    `None` when a body is a document rather than bytes or text (its size is the store's to tell)."""
    bodies: list[Body] = [row.body for row in step.events]
    bodies += [row.body for row in step.effects]
    if step.snapshot is not None:
        bodies += [*step.snapshot.bodies, step.snapshot.row.body]
    size = 0
    for body in bodies:
        if isinstance(body, bytes):
            size += len(body)
        elif isinstance(body, str):
            size += len(body.encode())
        else:
            return None
    return size
