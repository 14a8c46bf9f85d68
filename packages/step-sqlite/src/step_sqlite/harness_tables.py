"""The tables pydantic-ai-harness writes to a SQLite file, and what to say when step-sqlite meets them."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection

from stepcore.backend import is_harness_sqlite

__all__ = ('HARNESS_TABLES', 'describe_foreign_tables')

HARNESS_TABLES = (
    'runs',
    'events',
    'snapshots',
    'snapshot_idempotency_keys',
    'tool_effects',
    'snapshot_messages',
    'snapshot_message_refs',
    'media',
)
"""The harness's step and media tables (not its `conversations`): renamed aside, then dropped."""


def describe_foreign_tables(connection: sqlite3.Connection, tables: Collection[str]) -> str:
    """What to do about tables step-sqlite did not create, when pydantic-ai-harness made them ('' otherwise)."""
    if is_harness_sqlite(connection) and set(tables) & set(HARNESS_TABLES):
        return (
            '; it was written by pydantic-ai-harness: open it with SqliteStepStore(database=...) to migrate it in '
            'place (a backup is written beside it first), or copy its runs with '
            'stepcore import --from-harness PATH --store URL'
        )
    if 'conversations' in tables and _harness_conversations(connection):
        return (
            '; its conversations table holds pydantic-ai-harness conversation heads, which stepcore does not '
            'migrate: give stepcore conversation heads a database of their own'
        )
    return ''


def _harness_conversations(connection: sqlite3.Connection) -> bool:
    columns = {str(row[1]) for row in connection.execute('PRAGMA table_info("conversations")')}
    return {'id', 'revision', 'metadata', 'messages', 'search_text'} <= columns
