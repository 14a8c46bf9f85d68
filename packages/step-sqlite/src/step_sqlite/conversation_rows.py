"""A conversation's row in the `conversations` table: the columns read, the summary made of them, and the
metadata (names, tags, workspace, metadata mapping, counts) kept as JSON in one column."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any, cast

from .conversation_models import ConversationSummary
from .conversation_owner import running_owner

__all__ = (
    'COLUMNS',
    'METADATA_SCHEMA_VERSION',
    'REVISION',
    'current_summary',
    'fetch_row',
    'meta_json',
    'put_meta',
    'summary_of',
)

METADATA_SCHEMA_VERSION = 1
"""Version of the stored conversation metadata (names, tags, workspace, metadata mapping...)."""

COLUMNS = (
    'conversation_id, revision, name_revision, named_at_revision, meta_version, meta, message_count, '
    'created_at, updated_at, owner_pid, outcome, archived_at'
)
REVISION = 1
"""Index of the content revision in a row of `COLUMNS`."""


def summary_of(row: Sequence[Any]) -> ConversationSummary:
    """The summary a row of `COLUMNS` holds; `ValueError` for metadata newer than this release reads."""
    (
        conversation_id,
        revision,
        name_revision,
        named_at,
        meta_version,
        meta,
        count,
        created,
        updated,
        pid,
        outcome,
        archived,
    ) = row
    if meta_version > METADATA_SCHEMA_VERSION:
        raise ValueError(
            f'conversation {conversation_id!r} has metadata schema version {meta_version}, newer than this '
            f'step-sqlite reads (up to {METADATA_SCHEMA_VERSION}): upgrade step-sqlite'
        )
    info = cast(dict[str, Any], json.loads(meta))
    summary = ConversationSummary.model_validate(
        {
            'conversation_id': conversation_id,
            'workspace': info.get('workspace', ''),
            'checkout': info.get('checkout'),
            'revision': revision,
            'name_revision': name_revision,
            'named_at_revision': named_at,
            'title': info.get('title'),
            'subtitle': info.get('subtitle'),
            'tags': info.get('tags', []),
            'title_source': info.get('title_source'),
            'metadata': info.get('metadata', {}),
            'model': info.get('model'),
            'outcome': outcome,
            'run_id': info.get('run_id'),
            'writer_pid': pid,
            'message_count': count,
            'total_tokens': info.get('total_tokens', 0),
            'naming_tokens': info.get('naming_tokens', 0),
            'created_at': created,
            'updated_at': updated,
            'archived_at': archived,
        }
    )
    summary.busy = running_owner(summary) is not None
    return summary


def fetch_row(conn: sqlite3.Connection, conversation_id: str) -> tuple[Any, ...] | None:
    """The conversation's row of `COLUMNS`, or `None` when there is no such conversation."""
    return conn.execute(f'SELECT {COLUMNS} FROM conversations WHERE conversation_id = ?', (conversation_id,)).fetchone()


def current_summary(conn: sqlite3.Connection, conversation_id: str) -> ConversationSummary | None:
    """The conversation's summary as stored, or `None` when there is no such conversation."""
    row = fetch_row(conn, conversation_id)
    return None if row is None else summary_of(row)


def meta_json(summary: ConversationSummary) -> str:
    """The metadata column of `summary` (names, tags, workspace, metadata mapping, counts), as JSON."""
    for key, value in summary.metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'conversation metadata must map str to str; got {key!r}: {value!r}')
    return json.dumps(
        {
            'title': summary.title,
            'subtitle': summary.subtitle,
            'tags': list(summary.tags),
            'title_source': summary.title_source,
            'metadata': dict(summary.metadata),
            'workspace': summary.workspace,
            'checkout': None if summary.checkout is None else summary.checkout.model_dump(),
            'model': summary.model,
            'run_id': summary.run_id,
            'total_tokens': summary.total_tokens,
            'naming_tokens': summary.naming_tokens,
        },
        ensure_ascii=False,
    )


def put_meta(conn: sqlite3.Connection, summary: ConversationSummary) -> None:
    """Store `summary`'s metadata over the conversation's (its revisions and activity time stay)."""
    conn.execute(
        'UPDATE conversations SET meta_version = ?, meta = ? WHERE conversation_id = ?',
        (METADATA_SCHEMA_VERSION, meta_json(summary), summary.conversation_id),
    )
