"""The conversation-head tables and their migrations, versioned like the step tables (`schema.py`)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, cast

from .conversation_text import names_text
from .schema import Component

__all__ = ('CONVERSATIONS',)


_SCHEMA_V1 = """
CREATE TABLE conversations (
    conversation_id TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    name_revision INTEGER NOT NULL DEFAULT 0,
    named_at_revision INTEGER,
    meta_version INTEGER NOT NULL,
    meta TEXT NOT NULL,
    messages_format INTEGER NOT NULL,
    messages TEXT NOT NULL,
    message_count INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    writer_pid INTEGER
);
CREATE INDEX conversations_updated ON conversations (updated_at DESC, conversation_id);
CREATE VIRTUAL TABLE conversations_search USING fts5(conversation_id UNINDEXED, body, tokenize = 'trigram');
"""


def _create_v1(connection: sqlite3.Connection) -> None:
    for statement in (s.strip() for s in _SCHEMA_V1.split(';')):
        if statement:
            connection.execute(statement)


def _stored_names(meta: str) -> str:
    try:
        info = cast(dict[str, Any], json.loads(meta))
        return names_text(info.get('title'), info.get('subtitle'), info.get('tags') or ())
    except (ValueError, TypeError, AttributeError):
        return ''  # unreadable metadata is reported when the conversation is read, not here


def _v1_to_v2(connection: sqlite3.Connection) -> None:
    """Version 2: an outcome beside the owner's process id, an archive mark, names in the search.

    A conversation an older release saved with a writer process id was in progress: it becomes
    `'running'` with that owner, so it stays busy exactly while that process is alive.
    """
    connection.execute('ALTER TABLE conversations RENAME COLUMN writer_pid TO owner_pid')
    connection.execute("ALTER TABLE conversations ADD COLUMN outcome TEXT NOT NULL DEFAULT 'ready'")
    connection.execute("UPDATE conversations SET outcome = 'running' WHERE owner_pid IS NOT NULL")
    connection.execute('ALTER TABLE conversations ADD COLUMN archived_at TEXT')
    connection.execute(
        'CREATE VIRTUAL TABLE conversations_search_v2 '
        "USING fts5(conversation_id UNINDEXED, body, names, tokenize = 'trigram')"
    )
    rows = connection.execute(
        'SELECT s.conversation_id, s.body, c.meta FROM conversations_search s '
        'JOIN conversations c ON c.conversation_id = s.conversation_id'
    ).fetchall()
    connection.executemany(
        'INSERT INTO conversations_search_v2 (conversation_id, body, names) VALUES (?, ?, ?)',
        [(conversation_id, body, _stored_names(meta)) for conversation_id, body, meta in rows],
    )
    connection.execute('DROP TABLE conversations_search')
    connection.execute('ALTER TABLE conversations_search_v2 RENAME TO conversations_search')


CONVERSATIONS = Component(
    name='conversations',
    create=_create_v1,
    migrations={1: _v1_to_v2},
    tables=('conversations', 'conversations_search'),
)
"""The conversation-head tables, versioned like the step tables."""
