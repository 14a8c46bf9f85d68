"""Conversation heads: the accepted history of a multi-turn dialogue, kept in SQLite.

A conversation head is not a run checkpoint. It holds what the application accepted as the
dialogue so far — prompts, answers, and edits made between runs such as compaction — and moves by
revision: a writer saves on top of the revision it read, and a writer that read an older revision
is refused with `ConversationConflict` instead of silently overwriting newer content.

Names (title, subtitle, tags) are a separate revision line, so naming a conversation never races
its content and never changes when it was last active.

Busy detection is local only: a conversation saved with `in_progress=True` records the writer's
process id and reads as busy while a process with that id is alive on this machine (a reused id
counts as alive). It is not a lease and the database must not be shared between hosts.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, Field
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextContent,
    TextPart,
    UserPromptPart,
    post_compaction_window,
)

from stepcore.codec import check_format_version, decode_messages, encode_message
from stepcore.media import MediaStore
from stepcore.models import RECORD_FORMAT_VERSION, utcnow
from stepcore.protocols import StepStore
from stepcore.walker import DEFAULT_MEDIA_THRESHOLD_BYTES, MediaWalker

from .connection import Database, write_transaction
from .schema import STEPS, Component, ensure_schema, read_version

__all__ = (
    'METADATA_SCHEMA_VERSION',
    'ConversationConflict',
    'ConversationSummary',
    'SavedConversation',
    'SqliteConversationStore',
)

METADATA_SCHEMA_VERSION = 1
"""Version of the stored conversation metadata (names, tags, metadata mapping)."""

TitleSource = Literal['generated', 'manual']
T = TypeVar('T')
_UNSET: Any = object()


class ConversationConflict(Exception):
    """A save, name or delete was based on a revision that is no longer current (or deleted)."""

    def __init__(self, conversation_id: str, message: str) -> None:
        super().__init__(f'conversation {conversation_id!r}: {message}')
        self.conversation_id = conversation_id


class ConversationSummary(BaseModel):
    """What a listing shows of a conversation, and the revisions a writer bases its next write on."""

    conversation_id: str
    revision: int = 0
    """Content revision; 0 for a conversation that has never been saved."""
    name_revision: int = 0
    """Revision of the name (title, subtitle, tags), separate from content."""
    named_at_revision: int | None = None
    """Content revision the current name was made for."""
    title: str | None = None
    subtitle: str | None = None
    tags: list[str] = Field(default_factory=list[str])
    title_source: TitleSource | None = None
    metadata: dict[str, str] = Field(default_factory=dict[str, str])
    message_count: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    """Last content change (naming does not move it)."""
    writer_pid: int | None = None
    busy: bool = False
    """A live local process is still writing this conversation."""


class SavedConversation(BaseModel):
    """A conversation head with its messages."""

    summary: ConversationSummary
    messages: list[ModelMessage]


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else: conservatively alive
    except OSError:
        return True
    return True


def searchable_text(messages: Sequence[ModelMessage], metadata: Mapping[str, str] | None = None) -> str:
    """User and assistant text after the latest compaction, plus metadata values, case-folded.

    Tool calls and returns, reasoning, and history before a compaction are left out.
    """
    pieces: list[str] = []
    for message in post_compaction_window(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    content = part.content
                    if isinstance(content, str):
                        pieces.append(content)
                    else:
                        for item in content:
                            if isinstance(item, str):
                                pieces.append(item)
                            elif isinstance(item, TextContent):
                                pieces.append(item.content)
        elif isinstance(message, ModelResponse):  # pyright: ignore[reportUnnecessaryIsInstance]
            pieces.extend(part.content for part in message.parts if isinstance(part, TextPart))
    if metadata:
        pieces.extend(metadata.values())
    return '\n'.join(pieces).casefold()


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


CONVERSATIONS = Component(
    name='conversations',
    create=_create_v1,
    migrations={},
    tables=('conversations', 'conversations_search'),
)
"""The conversation-head tables, versioned like the step tables."""


_COLUMNS = (
    'conversation_id, revision, name_revision, named_at_revision, meta_version, meta, message_count, '
    'created_at, updated_at, writer_pid'
)


class SqliteConversationStore:
    """Conversation heads in a SQLite database (the same file as `SqliteStepStore` works well).

    `media_store` defaults to a `SqliteMediaStore` on the same database; large parts are
    externalized exactly as in step snapshots. `media_store=None` keeps them inline.

    Deleting a conversation deletes its runs through `step_store.delete_run`: by default the
    `SqliteStepStore` on the same database; pass the step store your runs live in when it is
    another one, or `None` to leave runs alone.
    """

    def __init__(
        self,
        database: str | os.PathLike[str] | None = None,
        *,
        connection: sqlite3.Connection | None = None,
        media_store: MediaStore | None = _UNSET,
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        step_store: StepStore | None = _UNSET,
    ) -> None:
        self._db = Database(database, connection, owner='SqliteConversationStore')
        self._db.add_setup(CONVERSATIONS.name, lambda conn: ensure_schema(conn, CONVERSATIONS, where=self._db.describe))
        if media_store is _UNSET:
            from .media import SqliteMediaStore

            media_store = SqliteMediaStore.on_database(self._db)
        self._walker = MediaWalker(media_store, media_threshold_bytes)
        self._own_steps = step_store is _UNSET
        if step_store is _UNSET:
            from .store import SqliteStepStore

            step_store = SqliteStepStore.on_database(self._db)
        self._steps: StepStore | None = step_store

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._db.run(fn)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call(conn: sqlite3.Connection) -> T:
            with write_transaction(conn):
                return fn(conn)

        return await self._db.run(call)

    @staticmethod
    def _summary(row: Sequence[Any]) -> ConversationSummary:
        (conversation_id, revision, name_revision, named_at, meta_version, meta, count, created, updated, pid) = row
        if meta_version > METADATA_SCHEMA_VERSION:
            raise ValueError(
                f'conversation {conversation_id!r} has metadata schema version {meta_version}, newer than this '
                f'step-sqlite reads (up to {METADATA_SCHEMA_VERSION}): upgrade step-sqlite'
            )
        info = cast(dict[str, Any], json.loads(meta))
        return ConversationSummary(
            conversation_id=conversation_id,
            revision=revision,
            name_revision=name_revision,
            named_at_revision=named_at,
            title=info.get('title'),
            subtitle=info.get('subtitle'),
            tags=info.get('tags', []),
            title_source=info.get('title_source'),
            metadata=info.get('metadata', {}),
            message_count=count,
            created_at=datetime.fromisoformat(created),
            updated_at=datetime.fromisoformat(updated),
            writer_pid=pid,
            busy=pid is not None and _pid_alive(pid),
        )

    @staticmethod
    def _fetch(conn: sqlite3.Connection, conversation_id: str) -> tuple[Any, ...] | None:
        return conn.execute(
            f'SELECT {_COLUMNS} FROM conversations WHERE conversation_id = ?', (conversation_id,)
        ).fetchone()

    @staticmethod
    def _meta(summary: ConversationSummary) -> str:
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
            },
            ensure_ascii=False,
        )

    # -- content ----------------------------------------------------------------------------

    async def save(
        self, *, summary: ConversationSummary, messages: Sequence[ModelMessage], in_progress: bool = False
    ) -> ConversationSummary:
        """Commit `messages` as the conversation's head on top of `summary.revision`.

        A new conversation is saved from a summary with `revision=0`. Raises `ConversationConflict`
        when the stored revision differs (another writer saved first) or the conversation was
        deleted. `in_progress=True` marks it busy for this process until a later save without it.
        Returns the committed summary; base the next save on it.
        """
        if not summary.conversation_id:
            raise ValueError('summary.conversation_id must be a non-empty string')
        meta = self._meta(summary)
        stored = [await self._walker.externalize(encode_message(m)) for m in messages]
        body = b'[' + b','.join(stored) + b']'
        search = searchable_text(messages, summary.metadata)
        now = utcnow().isoformat()
        pid = os.getpid() if in_progress else None
        conversation_id = summary.conversation_id

        def write(conn: sqlite3.Connection) -> tuple[Any, ...]:
            row = self._fetch(conn, conversation_id)
            if row is None:
                if summary.revision != 0:
                    raise ConversationConflict(
                        conversation_id, f'it was deleted (the save was based on revision {summary.revision})'
                    )
                conn.execute(
                    'INSERT INTO conversations (conversation_id, revision, name_revision, meta_version, meta, '
                    'messages_format, messages, message_count, created_at, updated_at, writer_pid) '
                    'VALUES (?, 1, 0, ?, ?, ?, ?, ?, ?, ?, ?)',
                    (
                        conversation_id,
                        METADATA_SCHEMA_VERSION,
                        meta,
                        RECORD_FORMAT_VERSION,
                        body.decode(),
                        len(messages),
                        now,
                        now,
                        pid,
                    ),
                )
            else:
                if row[1] != summary.revision:
                    raise ConversationConflict(
                        conversation_id,
                        f'the save was based on revision {summary.revision} but revision {row[1]} is stored: '
                        'reload it with get() and apply your change again',
                    )
                if row[4] > METADATA_SCHEMA_VERSION:
                    self._summary(row)  # raises the schema-version error
                conn.execute(
                    'UPDATE conversations SET revision = revision + 1, meta_version = ?, meta = ?, '
                    'messages_format = ?, messages = ?, message_count = ?, updated_at = ?, writer_pid = ? '
                    'WHERE conversation_id = ?',
                    (
                        METADATA_SCHEMA_VERSION,
                        meta,
                        RECORD_FORMAT_VERSION,
                        body.decode(),
                        len(messages),
                        now,
                        pid,
                        conversation_id,
                    ),
                )
                conn.execute('DELETE FROM conversations_search WHERE conversation_id = ?', (conversation_id,))
            conn.execute(
                'INSERT INTO conversations_search (conversation_id, body) VALUES (?, ?)', (conversation_id, search)
            )
            result = self._fetch(conn, conversation_id)
            assert result is not None
            return result

        return self._summary(await self._write(write))

    async def get(self, *, conversation_id: str) -> SavedConversation | None:
        """The conversation head with its messages restored, or `None` if there is none."""

        def read(conn: sqlite3.Connection) -> tuple[tuple[Any, ...], int, str] | None:
            row = self._fetch(conn, conversation_id)
            if row is None:
                return None
            fmt, body = conn.execute(
                'SELECT messages_format, messages FROM conversations WHERE conversation_id = ?', (conversation_id,)
            ).fetchone()
            return row, fmt, body

        found = await self._run(read)
        if found is None:
            return None
        row, fmt, body = found
        summary = self._summary(row)
        check_format_version(fmt, what=f'conversation {conversation_id!r} messages')
        items = cast(list[Any], json.loads(body))
        encoded = [
            await self._walker.restore(json.dumps(item, separators=(',', ':'), ensure_ascii=False).encode())
            for item in items
        ]
        return SavedConversation(summary=summary, messages=decode_messages(encoded))

    async def listing(self, *, query: str | None = None, limit: int = 50, offset: int = 0) -> list[ConversationSummary]:
        """Summaries, most recently active first, without loading messages.

        `query` matches user and assistant text (after the latest compaction) and metadata values,
        case-insensitively with Unicode case folding.
        """
        if limit < 0 or offset < 0:
            raise ValueError(f'limit={limit!r} and offset={offset!r} must be >= 0')
        needle = query.casefold() if query else None

        def read(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            if needle is None:
                return conn.execute(
                    f'SELECT {_COLUMNS} FROM conversations ORDER BY updated_at DESC, conversation_id LIMIT ? OFFSET ?',
                    (limit, offset),
                ).fetchall()
            if len(needle) >= 3:
                phrase = '"' + needle.replace('"', '""') + '"'
                match_ids = 'SELECT conversation_id FROM conversations_search WHERE body MATCH ?'
                arg = phrase
            else:  # the trigram index needs three characters; short queries scan
                match_ids = 'SELECT conversation_id FROM conversations_search WHERE instr(body, ?) > 0'
                arg = needle
            return conn.execute(
                f'SELECT {_COLUMNS} FROM conversations WHERE conversation_id IN ({match_ids}) '
                'ORDER BY updated_at DESC, conversation_id LIMIT ? OFFSET ?',
                (arg, limit, offset),
            ).fetchall()

        return [self._summary(row) for row in await self._run(read)]

    # -- names ------------------------------------------------------------------------------

    async def name(
        self,
        *,
        source: ConversationSummary,
        title: str,
        subtitle: str | None = None,
        tags: Iterable[str] = (),
        manual: bool = False,
    ) -> ConversationSummary | None:
        """Set the conversation's name, based on the summary it was made from.

        Returns the updated summary, or `None` when the name was not applied: a generated name
        (`manual=False`) is refused when the content moved past `source.revision`, when another
        name was written after `source.name_revision`, or when the title was set manually; a
        manual name is refused only when another name was written after `source`. The activity
        timestamp (`updated_at`) is not changed. `ConversationConflict` if the conversation is gone.
        """
        tag_list = list(tags)
        conversation_id = source.conversation_id

        def write(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            row = self._fetch(conn, conversation_id)
            if row is None:
                raise ConversationConflict(conversation_id, 'it was deleted; nothing to name')
            current = self._summary(row)
            if current.name_revision != source.name_revision:
                return None
            if not manual and (current.revision != source.revision or current.title_source == 'manual'):
                return None
            updated = current.model_copy(
                update={
                    'title': title,
                    'subtitle': subtitle,
                    'tags': tag_list,
                    'title_source': 'manual' if manual else 'generated',
                }
            )
            conn.execute(
                'UPDATE conversations SET name_revision = name_revision + 1, named_at_revision = revision, '
                'meta_version = ?, meta = ? WHERE conversation_id = ?',
                (METADATA_SCHEMA_VERSION, self._meta(updated), conversation_id),
            )
            return self._fetch(conn, conversation_id)

        row = await self._write(write)
        return self._summary(row) if row is not None else None

    # -- deletion ---------------------------------------------------------------------------

    async def delete(self, *, source: ConversationSummary) -> None:
        """Remove the conversation, then its runs through the step store's `delete_run`.

        Media blobs are kept (they are content-addressed and may be shared). Raises
        `ConversationConflict` when the content moved past `source.revision` or it is already gone.
        The head goes first, in one transaction with the revision check; a run the process did not
        get to delete stays listed by `list_runs(conversation_id=...)` and can be deleted later.
        """
        conversation_id = source.conversation_id

        def write(conn: sqlite3.Connection) -> bool:
            row = self._fetch(conn, conversation_id)
            if row is None:
                raise ConversationConflict(conversation_id, 'it was already deleted')
            if row[1] != source.revision:
                raise ConversationConflict(
                    conversation_id,
                    f'the delete was based on revision {source.revision} but revision {row[1]} is stored',
                )
            conn.execute('DELETE FROM conversations_search WHERE conversation_id = ?', (conversation_id,))
            conn.execute('DELETE FROM conversations WHERE conversation_id = ?', (conversation_id,))
            return read_version(conn, STEPS.name) is not None

        has_step_tables = await self._write(write)
        steps = self._steps
        if steps is None or (self._own_steps and not has_step_tables):
            return  # no runs here: do not create step tables just to look
        for run in await steps.list_runs(conversation_id=conversation_id):
            await steps.delete_run(run.run_id)

    async def aclose(self) -> None:
        """Close the connection if this store opened it."""
        await self._db.aclose()

    async def __aenter__(self) -> SqliteConversationStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
