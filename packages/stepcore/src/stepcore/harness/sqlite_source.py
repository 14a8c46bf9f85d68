"""Reading a SQLite database written by pydantic-ai-harness.

Two layouts, told apart per snapshot row: releases up to 0.57 keep each snapshot's history inline
in `snapshots.messages` (a JSON list); from 0.58 a row holds `{"stored_messages": N}` and its
history is the `snapshot_message_refs` rows of its `seq`, in `position` order, each naming a
message in `snapshot_messages` by its sha256. Columns a release did not have yet (`state`,
`idempotency_key`, `registration_id`) read as missing. Externalized payloads are in the `media`
table, keyed by sha256.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic_ai.messages import ModelMessage

from stepcore.harness.records import effect_from_harness, event_from_harness, run_from_harness, snapshot_from_harness
from stepcore.harness.source import HarnessRun, HarnessSource, decode_history

__all__ = ('HarnessSqliteSource', 'is_harness_sqlite', 'open_harness_sqlite')

RUN_COLUMNS = ('run_id', 'conversation_id', 'parent_run_id', 'agent_name', 'metadata', 'started_at', 'registration_id')
EVENT_COLUMNS = (
    'seq',
    'run_id',
    'kind',
    'step_index',
    'timestamp',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'tool_call_id',
    'tool_name',
    'error',
    'metadata',
    'idempotency_key',
)
SNAPSHOT_COLUMNS = (
    'seq',
    'run_id',
    'step_index',
    'conversation_id',
    'parent_run_id',
    'agent_name',
    'timestamp',
    'state',
    'messages',
    'idempotency_key',
)
EFFECT_COLUMNS = (
    'run_id',
    'tool_call_id',
    'tool_name',
    'status',
    'started_at',
    'ended_at',
    'idempotency_key',
    'effect_summary',
)
STEPCORE_SCHEMA_TABLE = 'stepcore_schema'
"""The table where stepcore's SQLite store records its layout version."""
REQUIRED = {
    'runs': ('run_id', 'metadata', 'started_at'),
    'events': ('seq', 'run_id', 'kind'),
    'snapshots': ('seq', 'run_id', 'messages'),
    'tool_effects': ('run_id', 'tool_call_id', 'status'),
}
"""The tables every release creates, and columns that only a harness table of that name has."""


def _columns(connection: sqlite3.Connection, table: str) -> set[str]:
    return {str(row[1]) for row in connection.execute(f'PRAGMA table_info("{table}")')}


def is_harness_sqlite(connection: sqlite3.Connection, *, prefix: str = '') -> bool:
    """Whether the database has pydantic-ai-harness's step tables (named with `prefix`)."""
    return all(set(columns) <= _columns(connection, prefix + table) for table, columns in REQUIRED.items())


class HarnessSqliteSource(HarnessSource):
    """The runs of a harness SQLite database, read through `connection` (which this never closes).

    `prefix` is put before every table name, for a database whose harness tables were renamed;
    `owned=True` closes the connection with the source.
    """

    def __init__(self, connection: sqlite3.Connection, *, where: str, prefix: str = '', owned: bool = False) -> None:
        if not is_harness_sqlite(connection, prefix=prefix):
            if _columns(connection, STEPCORE_SCHEMA_TABLE):
                raise ValueError(f'{where} is a stepcore database, not a pydantic-ai-harness one: open it as it is')
            raise ValueError(
                f'{where} is not a pydantic-ai-harness step database: it lacks the runs, events, snapshots '
                'and tool_effects tables that every harness release creates'
            )
        self._conn = connection
        self._owned = owned
        self._where = where
        self._prefix = prefix
        self._has = {
            table: _columns(connection, prefix + table)
            for table in ('runs', 'events', 'snapshots', 'tool_effects', 'snapshot_message_refs', 'snapshot_messages')
        }
        self._has['media'] = _columns(connection, prefix + 'media')

    def describe(self) -> str:
        return self._where

    def close(self) -> None:
        if self._owned:
            self._conn.close()

    def _table(self, name: str) -> str:
        return f'"{self._prefix}{name}"'

    def _select(
        self, table: str, columns: Iterable[str], where: str, params: tuple[Any, ...], order: str
    ) -> list[dict[str, Any]]:
        """Rows as dicts of `columns`; a column the table lacks reads as `None`."""
        names = list(columns)
        present = self._has[table]
        listed = ', '.join(name if name in present else f'NULL AS {name}' for name in names)
        sql = f'SELECT {listed} FROM {self._table(table)} WHERE {where} ORDER BY {order}'
        return [dict(zip(names, row, strict=True)) for row in self._conn.execute(sql, params)]

    def run_ids(self) -> list[str]:
        runs = self._table('runs')
        recorded = [str(row[0]) for row in self._conn.execute(f'SELECT run_id FROM {runs} ORDER BY started_at, rowid')]
        unrecorded = self._conn.execute(
            f'SELECT run_id FROM {self._table("events")} UNION SELECT run_id FROM {self._table("snapshots")} '
            f'UNION SELECT run_id FROM {self._table("tool_effects")} EXCEPT SELECT run_id FROM {runs} ORDER BY 1'
        )
        return recorded + [str(row[0]) for row in unrecorded]

    def read_run(self, run_id: str) -> HarnessRun:
        run = HarnessRun(run_id=run_id)
        rows = self._select('runs', RUN_COLUMNS, 'run_id = ?', (run_id,), 'rowid')
        if rows:
            run.record = run.read('the run record', lambda: run_from_harness(rows[0]))
            if run.record is None:
                return run  # nothing of a run whose record cannot be read is imported
        for row in self._select('events', EVENT_COLUMNS, 'run_id = ?', (run_id,), 'seq'):
            event = run.read(f'event seq={row["seq"]}', lambda row=row: event_from_harness(row))
            if event is not None:
                run.events.append(event)
        for row in self._select('snapshots', SNAPSHOT_COLUMNS, 'run_id = ?', (run_id,), 'seq'):
            snapshot = run.read(
                f'snapshot seq={row["seq"]}',
                lambda row=row: snapshot_from_harness(row, self._history(row['seq'], row['messages'], run.media)),
            )
            if snapshot is not None:
                run.snapshots.append(snapshot)
        for row in self._select('tool_effects', EFFECT_COLUMNS, 'run_id = ?', (run_id,), 'started_at, rowid'):
            effect = run.read(
                f'ledger entry of tool call {row["tool_call_id"]!r}', lambda row=row: effect_from_harness(row)
            )
            if effect is not None:
                run.tool_effects.append(effect)
        return run

    def _history(self, seq: int, stored: object, media: set[str]) -> list[ModelMessage]:
        if not isinstance(stored, str):
            raise ValueError(f'its messages column holds {type(stored).__name__}, not JSON text')
        if not stored.startswith('{'):
            return decode_history(stored, self._blob, media)  # a history written inline
        count = json.loads(stored).get('stored_messages')
        if not isinstance(count, int):
            raise ValueError(f'its messages column {stored[:80]!r} is neither a history nor a stored-message count')
        if not self._has['snapshot_message_refs'] or not self._has['snapshot_messages']:
            raise ValueError('it refers to stored messages but the database has no snapshot_messages tables')
        found = [
            row[0]
            for row in self._conn.execute(
                f'SELECT m.message FROM {self._table("snapshot_message_refs")} AS r '
                f'JOIN {self._table("snapshot_messages")} AS m ON m.sha256 = r.sha256 '
                'WHERE r.snapshot_seq = ? ORDER BY r.position',
                (seq,),
            )
        ]
        if len(found) != count:
            raise ValueError(f'{count - len(found)} of its {count} stored messages are missing')
        return decode_history('[' + ','.join(found) + ']', self._blob, media)

    def _blob(self, digest: str) -> bytes:
        if 'bytes' not in self._has['media']:
            raise LookupError(f'media+sha256://{digest} is externalized but {self._where} has no media table')
        row = self._conn.execute(f'SELECT bytes FROM {self._table("media")} WHERE sha256 = ?', (digest,)).fetchone()
        if row is None:
            raise LookupError(f'media+sha256://{digest} is not in the media table of {self._where}')
        return bytes(row[0])


def open_harness_sqlite(path: Path) -> HarnessSqliteSource:
    """A harness database file opened read-only (its connection closes with the source)."""
    connection = sqlite3.connect(f'{path.resolve().as_uri()}?mode=ro', uri=True, check_same_thread=False)
    try:
        return HarnessSqliteSource(connection, where=f'database {str(path)!r}', owned=True)
    except BaseException:
        connection.close()
        raise
