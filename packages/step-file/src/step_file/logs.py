"""What a process keeps of a run's record logs: the folds of `events.jsonl`, `tool_effects.jsonl`
and `snapshot-keys.jsonl` (see `files.Log`).

A line that cannot be read is never dropped silently: a ledger line becomes an entry the engine
refuses to read (a ledger entry left out could hide an effect in flight), an event line is
handed over when the events are listed, and a snapshot-key line is logged.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, cast

from stepcore.backend import (
    SnapshotState,
    ToolEffectStatus,
    ops,
)

__all__ = ('EPOCH', 'EventsSeen', 'KeysSeen', 'LedgerSeen', 'json_object')

logger = logging.getLogger('step_file')

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
"""Stands for a time a damaged record does not say."""

_STATUSES = frozenset(s.value for s in ToolEffectStatus)
_STATES = frozenset(s.value for s in SnapshotState)
_TOOL_CALL_ID = re.compile(rb'"tool_call_id":("(?:[^"\\]|\\.)*")')


def json_object(raw: bytes | str) -> dict[str, Any] | None:
    """`raw` parsed as a JSON object, or `None`."""
    try:
        value: Any = json.loads(raw)
    except ValueError:
        return None
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


def _time(value: object) -> datetime:
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return EPOCH
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return EPOCH


@dataclass(slots=True)
class EventsSeen:
    """`events.jsonl`: the next seq and the idempotency keys applied.

    A line whose seq cannot be read still takes the seq of its line number, so no seq is reused.
    """

    next_seq: int = 1
    keys: set[str] = field(default_factory=set[str])

    def add(self, number: int, line: bytes) -> None:
        data = json_object(line)
        seq = data.get('seq') if data is not None else None
        self.next_seq = max(self.next_seq, number + 1, seq + 1 if isinstance(seq, int) else 0)
        key = data.get('idempotency_key') if data is not None else None
        if isinstance(key, str):
            self.keys.add(key)


@dataclass(slots=True)
class LedgerSeen:
    """`tool_effects.jsonl`: the latest line of each tool call, in the order calls were first recorded.

    A line that cannot be read becomes an entry with status `''` under its tool call id when that
    can be read, else under a placeholder naming the line.
    """

    run_id: str
    path: Path
    entries: dict[str, ops.EffectRow] = field(default_factory=dict[str, ops.EffectRow])
    earlier: dict[str, list[ops.EffectRow]] = field(default_factory=dict[str, list[ops.EffectRow]])
    """The lines each call's latest one superseded, oldest first: answered with it, so that a
    damaged line (one whose call id was altered, say) is checked rather than hidden behind a later one."""

    def rows(self, tool_call_id: str | None = None) -> list[ops.EffectRow]:
        """Every line's row, each call's superseded lines before its latest, calls in first-recorded order."""
        return [
            row
            for call, latest in self.entries.items()
            if tool_call_id is None or call == tool_call_id or not latest.status
            for row in (*self.earlier.get(call, ()), latest)
        ]

    def add(self, number: int, line: bytes) -> None:
        data = json_object(line)
        tool_call_id = data.get('tool_call_id') if data is not None else None
        status = data.get('status', ToolEffectStatus.STARTED.value) if data is not None else None
        if data is not None and isinstance(tool_call_id, str) and status in _STATUSES:
            row = ops.EffectRow(self.run_id, tool_call_id, cast(str, status), _time(data.get('started_at')), line)
        else:
            if not isinstance(tool_call_id, str):
                tool_call_id = _damaged_call_id(line) or f'(unreadable line {number} of {self.path.name})'
            row = ops.EffectRow(self.run_id, tool_call_id, '', EPOCH, line)
        previous = self.entries.get(row.tool_call_id)
        if previous is not None:
            self.earlier.setdefault(row.tool_call_id, []).append(previous)
        self.entries[row.tool_call_id] = row


def _damaged_call_id(line: bytes) -> str | None:
    match = _TOOL_CALL_ID.search(line)
    if match is None:
        return None
    try:
        value: Any = json.loads(match.group(1))
    except ValueError:
        return None
    return value if isinstance(value, str) else None


@dataclass(slots=True)
class KeysSeen:
    """`snapshot-keys.jsonl` (one line per saved snapshot: seq, state, idempotency key): the next
    seq, the keys applied (kept when snapshots are pruned) and the state of each snapshot saved."""

    path: Path
    next_seq: int = 1
    keys: set[str] = field(default_factory=set[str])
    states: dict[int, str] = field(default_factory=dict[int, str])

    def add(self, number: int, line: bytes) -> None:
        data = json_object(line)
        seq = data.get('seq') if data is not None else None
        if data is None or not isinstance(seq, int):
            logger.warning(
                'step_file: line %d of %s is damaged: the snapshot it records is not known to retention, '
                'and its idempotency key no longer suppresses a replayed save: %r',
                number,
                self.path,
                line[:200],
            )
            return
        self.next_seq = max(self.next_seq, seq + 1)
        state = data.get('state')
        if state in _STATES:
            self.states[seq] = cast(str, state)
        key = data.get('key')
        if isinstance(key, str):
            self.keys.add(key)
