"""Conversation heads: the accepted history of a multi-turn dialogue, kept in SQLite.

A conversation head is not a run checkpoint. It holds what the application accepted as the
dialogue so far — prompts, answers, and edits made between runs such as compaction — and moves by
revision: a writer saves on top of the revision it read, and a writer that read an older revision
is refused with `ConversationConflict` instead of silently overwriting newer content.

Names (title, subtitle, tags) are a separate revision line, so naming a conversation never races
its content and never changes when it was last active. Archiving is a mark beside both.

Ownership is local only: a conversation saved as `'running'` by a process (`in_progress=True`)
belongs to that process while it is alive on this machine (a reused id counts as alive);
`ensure_inactive` and `save` refuse to take it from a live owner. It is not a lease and the
database must not be shared between hosts.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, cast

from pydantic_ai.messages import ModelMessage, ModelResponse

from stepcore.backend import (
    DEFAULT_MEDIA_THRESHOLD_BYTES,
    RECORD_FORMAT_VERSION,
    MediaStore,
    MediaStoreOption,
    MediaWalker,
    StepStore,
    check_format_version,
    decode_messages,
    encode_message,
    resolve_media_store,
    utcnow,
)

from .connection import Database, write_transaction
from .conversation_models import (
    ConversationConflict,
    ConversationSummary,
    GitCheckout,
    Outcome,
    SavedConversation,
    TitleSource,
)
from .conversation_owner import ensure_inactive, running_owner
from .conversation_rows import (
    COLUMNS,
    METADATA_SCHEMA_VERSION,
    REVISION,
    current_summary,
    fetch_row,
    meta_json,
    put_meta,
    summary_of,
)
from .conversation_schema import CONVERSATIONS
from .conversation_text import conversation_text, names_text, searchable_text
from .media import SqliteMediaStore
from .schema import STEPS, ensure_schema, read_version
from .store import SqliteStepStore

__all__ = (
    'METADATA_SCHEMA_VERSION',
    'ConversationConflict',
    'ConversationSummary',
    'GitCheckout',
    'Outcome',
    'SavedConversation',
    'SqliteConversationStore',
    'TitleSource',
    'conversation_text',
    'ensure_inactive',
    'searchable_text',
)

T = TypeVar('T')
_UNSET: Any = object()


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


class SqliteConversationStore:
    """Conversation heads in a SQLite database (the same file as `SqliteStepStore` works well).

    `media_store` defaults to `'auto'`: a `SqliteMediaStore` on the same database; large parts are
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
        media_store: MediaStoreOption = 'auto',
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        step_store: StepStore | None = _UNSET,
    ) -> None:
        db = self.__db = Database.open(database, connection, owner='SqliteConversationStore')
        db.add_setup(CONVERSATIONS.name, lambda conn: ensure_schema(conn, CONVERSATIONS, where=db.describe))

        media = resolve_media_store(
            media_store, default=lambda: SqliteMediaStore(self.__db), owner='SqliteConversationStore'
        )
        self.__walker = MediaWalker(media, media_threshold_bytes)
        self.__own_steps = step_store is _UNSET
        if step_store is _UNSET:
            step_store = SqliteStepStore(self.__db)
        self.__steps: StepStore | None = step_store

    @property
    def database(self) -> Path | None:
        """The database file, or `None` for a store on a shared connection."""
        return None if self.__db.path is None else Path(self.__db.path)

    @property
    def media_store(self) -> MediaStore | None:
        """Where large parts of saved messages go (`None`: kept inline)."""
        return self.__walker.media_store

    @property
    def media(self) -> MediaStore | None:
        """The same as `media_store` (the name pydantic-ai-harness uses)."""
        return self.__walker.media_store

    # -- plumbing ---------------------------------------------------------------------------

    async def __run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self.__db.run(fn)

    async def __write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call(conn: sqlite3.Connection) -> T:
            with write_transaction(conn):
                return fn(conn)

        return await self.__db.run(call)

    # -- content ----------------------------------------------------------------------------

    async def save(
        self,
        *,
        summary: ConversationSummary,
        messages: Sequence[ModelMessage],
        in_progress: bool | None = None,
    ) -> ConversationSummary:
        """Commit `messages` as the conversation's head on top of `summary.revision`.

        A new conversation is saved from a summary with `revision=0`. Raises `ConversationConflict`
        when the stored revision differs (another writer saved first), when the conversation was
        deleted, or when this save would take a conversation running in another live process.
        Returns the committed summary; base the next save on it.

        The summary's `outcome` and `owner_pid` are stored as given. `in_progress=True` takes the
        conversation for this process (`'running'`, owner this process id); `in_progress=False`
        lets it go (no owner; `'running'` becomes `'ready'`). The stored name (title, subtitle,
        tags, naming tokens) is kept, so a name committed meanwhile is not overwritten; an archived
        conversation is listed again. `message_count` and `total_tokens` are counted from `messages`.
        """
        if not summary.conversation_id:
            raise ValueError('summary.conversation_id must be a non-empty string')
        outcome, owner = summary.outcome, summary.writer_pid
        if in_progress:
            outcome, owner = 'running', os.getpid()
        elif in_progress is not None:
            outcome, owner = ('ready' if outcome == 'running' else outcome), None
        total_tokens = sum(m.usage.total_tokens for m in messages if isinstance(m, ModelResponse))
        wanted = summary.model_copy(update={'outcome': outcome, 'writer_pid': owner, 'total_tokens': total_tokens})
        meta = meta_json(wanted)
        stored = [await self.__walker.externalize(encode_message(m)) for m in messages]
        body = (b'[' + b','.join(stored) + b']').decode()
        search = '\n'.join(p for p in (searchable_text(messages, summary.metadata), summary.workspace.casefold()) if p)
        now = utcnow().isoformat()
        conversation_id = summary.conversation_id

        def write(conn: sqlite3.Connection) -> tuple[Any, ...]:
            row = fetch_row(conn, conversation_id)
            if row is None:
                if summary.revision != 0:
                    raise ConversationConflict(
                        conversation_id, f'it was deleted (the save was based on revision {summary.revision})'
                    )
                conn.execute(
                    'INSERT INTO conversations (conversation_id, revision, name_revision, meta_version, meta, '
                    'messages_format, messages, message_count, created_at, updated_at, owner_pid, outcome, '
                    'archived_at) VALUES (?, 1, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
                    (
                        conversation_id,
                        METADATA_SCHEMA_VERSION,
                        meta,
                        RECORD_FORMAT_VERSION,
                        body,
                        len(messages),
                        now,
                        now,
                        owner,
                        outcome,
                        _iso(summary.archived_at),
                    ),
                )
                names = names_text(summary.title, summary.subtitle, summary.tags)
            else:
                if row[REVISION] != summary.revision:
                    raise ConversationConflict(
                        conversation_id,
                        f'the save was based on revision {summary.revision} but revision {row[REVISION]} is '
                        'stored: it was saved since by another process (or another writer in this one); reload it '
                        'with get() and apply your change again',
                    )
                current = summary_of(row)  # raises on a metadata version this release does not read
                holder = running_owner(current)
                if holder is not None and outcome == 'running' and owner is not None and owner != holder:
                    raise ConversationConflict(
                        conversation_id,
                        f'it is running in process {holder} on this machine, so it is busy: this save would take '
                        f'it for process {owner}; wait for process {holder} to finish or stop it, then read the '
                        'conversation again',
                    )
                kept = wanted.model_copy(
                    update={
                        'title': current.title,
                        'subtitle': current.subtitle,
                        'tags': current.tags,
                        'title_source': current.title_source,
                        'naming_tokens': current.naming_tokens,
                    }
                )
                conn.execute(
                    'UPDATE conversations SET revision = revision + 1, meta_version = ?, meta = ?, '
                    'messages_format = ?, messages = ?, message_count = ?, updated_at = ?, owner_pid = ?, '
                    'outcome = ?, archived_at = NULL WHERE conversation_id = ?',
                    (
                        METADATA_SCHEMA_VERSION,
                        meta_json(kept),
                        RECORD_FORMAT_VERSION,
                        body,
                        len(messages),
                        now,
                        owner,
                        outcome,
                        conversation_id,
                    ),
                )
                conn.execute('DELETE FROM conversations_search WHERE conversation_id = ?', (conversation_id,))
                names = names_text(current.title, current.subtitle, current.tags)
            conn.execute(
                'INSERT INTO conversations_search (conversation_id, body, names) VALUES (?, ?, ?)',
                (conversation_id, search, names),
            )
            result = fetch_row(conn, conversation_id)
            assert result is not None
            return result

        return summary_of(await self.__write(write))

    async def get(self, *, conversation_id: str) -> SavedConversation | None:
        """The conversation head with its messages restored, or `None` if there is none."""

        def read(conn: sqlite3.Connection) -> tuple[tuple[Any, ...], int, str] | None:
            row = fetch_row(conn, conversation_id)
            if row is None:
                return None
            fmt, body = conn.execute(
                'SELECT messages_format, messages FROM conversations WHERE conversation_id = ?', (conversation_id,)
            ).fetchone()
            return row, fmt, body

        found = await self.__run(read)
        if found is None:
            return None
        row, fmt, body = found
        summary = summary_of(row)
        check_format_version(fmt, what=f'conversation {conversation_id!r} messages')
        items = cast(list[Any], json.loads(body))
        encoded = [
            await self.__walker.restore(json.dumps(item, separators=(',', ':'), ensure_ascii=False).encode())
            for item in items
        ]
        return SavedConversation(summary=summary, messages=decode_messages(encoded))

    async def listing(
        self,
        *,
        query: str | None = None,
        limit: int = 200,
        offset: int = 0,
        archived: bool | None = None,
    ) -> list[ConversationSummary]:
        """Summaries, most recently active first, without loading messages.

        `query` matches user and assistant text (after the latest compaction), the title, subtitle
        and tags, the workspace and metadata values, case-insensitively with Unicode case folding.
        `archived=False` leaves archived conversations out, `True` lists only those, `None` both.
        """
        if limit < 0 or offset < 0:
            raise ValueError(f'limit={limit!r} and offset={offset!r} must be >= 0')
        if archived is not None and not isinstance(archived, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'archived={archived!r} must be True, False or None')
        needle = query.casefold() if query else None
        where: list[str] = []
        args: list[object] = []
        if archived is not None:
            where.append('archived_at IS NOT NULL' if archived else 'archived_at IS NULL')
        if needle is not None:
            if len(needle) >= 3:
                where.append(
                    'conversation_id IN (SELECT conversation_id FROM conversations_search WHERE conversations_search '
                    'MATCH ?)'
                )
                args.append('"' + needle.replace('"', '""') + '"')
            else:  # the trigram index needs three characters; short queries scan
                where.append(
                    'conversation_id IN (SELECT conversation_id FROM conversations_search '
                    'WHERE instr(body, ?) > 0 OR instr(names, ?) > 0)'
                )
                args.extend((needle, needle))
        condition = f'WHERE {" AND ".join(where)} ' if where else ''
        sql = (
            f'SELECT {COLUMNS} FROM conversations {condition}ORDER BY updated_at DESC, conversation_id LIMIT ? OFFSET ?'
        )

        def read(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(sql, (*args, limit, offset)).fetchall()

        return [summary_of(row) for row in await self.__run(read)]

    # -- names and archive ------------------------------------------------------------------

    async def name(
        self,
        *,
        source: ConversationSummary,
        title: str,
        subtitle: str | None = None,
        tags: Iterable[str] = (),
        manual: bool = False,
        tokens: int = 0,
    ) -> ConversationSummary | None:
        """Set the conversation's name, based on the summary it was made from.

        Returns the updated summary, or `None` when the name was not applied: a generated name
        (`manual=False`) is refused when the content moved past `source.revision`, when another
        name was written after `source.name_revision`, or when the title was set manually; a
        manual name is refused only when another name was written after `source`; nothing is
        applied to a deleted conversation. `tokens` (spent producing the name) is added to the
        conversation's `naming_tokens` even when the name is refused, as long as it exists. The
        activity timestamp (`updated_at`) is not changed.
        """
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'tokens={tokens!r} must be a whole number of tokens >= 0')
        tag_list = list(tags)
        conversation_id = source.conversation_id

        def write(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            current = current_summary(conn, conversation_id)
            if current is None:
                return None
            if tokens:
                current = current.model_copy(update={'naming_tokens': current.naming_tokens + tokens})
                put_meta(conn, current)
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
            put_meta(conn, updated)
            conn.execute(
                'UPDATE conversations SET name_revision = name_revision + 1, named_at_revision = revision '
                'WHERE conversation_id = ?',
                (conversation_id,),
            )
            conn.execute(
                'UPDATE conversations_search SET names = ? WHERE conversation_id = ?',
                (names_text(title, subtitle, tag_list), conversation_id),
            )
            return fetch_row(conn, conversation_id)

        row = await self.__write(write)
        return summary_of(row) if row is not None else None

    async def set_archived(self, *, conversation_id: str, archived: bool) -> ConversationSummary:
        """Archive or unarchive a conversation and return its summary.

        Its messages, revisions and activity time stay as they are; archiving one already archived
        keeps the first time. `LookupError` when there is no such conversation.
        """
        if not isinstance(archived, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'archived={archived!r} must be True or False')
        when = utcnow().isoformat()

        def write(conn: sqlite3.Connection) -> tuple[Any, ...]:
            row = fetch_row(conn, conversation_id)
            if row is None:
                raise LookupError(
                    f'no conversation {conversation_id!r} to {"archive" if archived else "unarchive"}: '
                    'check the id with listing()'
                )
            conn.execute(
                'UPDATE conversations SET archived_at = CASE WHEN ? THEN COALESCE(archived_at, ?) END '
                'WHERE conversation_id = ?',
                (archived, when, conversation_id),
            )
            result = fetch_row(conn, conversation_id)
            assert result is not None
            return result

        return summary_of(await self.__write(write))

    # -- deletion ---------------------------------------------------------------------------

    async def delete(self, *, source: ConversationSummary) -> None:
        """Remove the conversation, then its runs through the step store's `delete_run`.

        Media blobs are kept (they are content-addressed and may be shared). Raises
        `ConversationConflict` when the content moved past `source.revision`, when it is already
        gone, or when it is running in a process still alive on this machine (`ensure_inactive`).
        The head goes first, in one transaction with those checks; a run the process did not get
        to delete stays listed by `list_runs(conversation_id=...)` and can be deleted later.
        """
        conversation_id = source.conversation_id

        def write(conn: sqlite3.Connection) -> bool:
            row = fetch_row(conn, conversation_id)
            if row is None:
                raise ConversationConflict(conversation_id, 'it was already deleted')
            if row[REVISION] != source.revision:
                raise ConversationConflict(
                    conversation_id,
                    f'the delete was based on revision {source.revision} but revision {row[REVISION]} is stored',
                )
            ensure_inactive(summary_of(row))
            conn.execute('DELETE FROM conversations_search WHERE conversation_id = ?', (conversation_id,))
            conn.execute('DELETE FROM conversations WHERE conversation_id = ?', (conversation_id,))
            return read_version(conn, STEPS.name) is not None

        has_step_tables = await self.__write(write)
        steps = self.__steps
        if steps is None or (self.__own_steps and not has_step_tables):
            return  # no runs here: do not create step tables just to look
        for run in await steps.list_runs(conversation_id=conversation_id):
            await steps.delete_run(run.run_id)

    async def aclose(self) -> None:
        """Close the connection if this store opened it."""
        await self.__db.aclose()

    async def __aenter__(self) -> SqliteConversationStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
