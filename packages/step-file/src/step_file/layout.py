"""The layout of a run folder: its file names, the files holding one record each (`run.json`,
`snapshots/<seq>.json`), and how a record's body becomes a line or a file.

A file that cannot be read is handed to the engine as a body that raises when read, saying why
(`ops.Unreadable` when the file itself cannot be read, `Unparsable` when its content cannot be taken
apart), so the engine's damage policy applies to it like to any damaged record.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from stepcore.backend import (
    FORMAT_KEY,
    RECORD_FORMAT_VERSION,
    SnapshotState,
    check_format_version,
    ops,
)

from .logs import EPOCH, json_object

__all__ = (
    'EFFECTS_FILE',
    'EVENTS_FILE',
    'LEASE_FILE',
    'LEASE_INDEX_DIR',
    'LEASE_START_FILE',
    'LOCK_FILE',
    'MEDIA_DIR',
    'MESSAGES_FILE',
    'RUN_FILE',
    'RUN_FILES',
    'SNAPSHOTS_DIR',
    'SNAPSHOT_KEYS_FILE',
    'SNAPSHOT_NAME',
    'STATES',
    'STORE_ID_FILE',
    'Uncommitted',
    'as_bytes',
    'holds_records',
    'read_run',
    'read_snapshot',
    'snapshot_document',
    'with_field',
)

RUN_FILE = 'run.json'
EVENTS_FILE = 'events.jsonl'
EFFECTS_FILE = 'tool_effects.jsonl'
SNAPSHOT_KEYS_FILE = 'snapshot-keys.jsonl'
MESSAGES_FILE = 'messages.jsonl'
SNAPSHOTS_DIR = 'snapshots'
LOCK_FILE = '.lock'
MEDIA_DIR = 'media'
LEASE_FILE = 'lease.json'
LEASE_START_FILE = 'lease-start'
LEASE_INDEX_DIR = '.leases+'
"""The store's index of live lease states, `<directory>/.leases+/<state>/<run id>` (see `leases.py`):
a `+` is no run id's character, so no run folder can take the name, and the leading `.` keeps it out
of the run listings."""

STORE_ID_FILE = '.store-id+'
"""The store's id (`stepcore.backend.ops.StoreIdentity`), `<directory>/.store-id+`: one line of text,
created once and complete (a hard link of a finished temporary file), like `LEASE_INDEX_DIR` a name no
run folder can take and no run listing shows."""

RUN_FILES = (RUN_FILE, EVENTS_FILE, EFFECTS_FILE, SNAPSHOT_KEYS_FILE, MESSAGES_FILE, LEASE_FILE, LEASE_START_FILE)
"""The files of a run's folder besides its lock and its snapshots folder."""

SNAPSHOT_NAME = re.compile(r'(\d+)\.json')
STATES = frozenset(s.value for s in SnapshotState)
_FORMAT_STAMP = b'{"' + FORMAT_KEY.encode() + b'":'


class Uncommitted(Exception):
    """A snapshot whose file or messages never reached the disk (an interrupted write)."""


def with_field(body: ops.Body, key: str, value: int | str) -> bytes:
    """`body` (a JSON object) with `key` set, as one compact line's bytes (no newline).

    The field goes right after the format stamp that leads the engine's encoding, where the
    store's earlier releases wrote it.
    """
    if isinstance(body, Mapping):
        return json.dumps({**body, key: value}, separators=(',', ':'), ensure_ascii=False).encode()
    raw = body.encode() if isinstance(body, str) else body
    field_text = b',' + json.dumps(key).encode() + b':' + json.dumps(value, ensure_ascii=False).encode()
    if raw.startswith(_FORMAT_STAMP):
        cut = raw.find(b',')
        cut = len(raw) - 1 if cut < 0 else cut
        return raw[:cut] + field_text + raw[cut:]
    rest = raw[1:].lstrip()
    return b'{' + field_text[1:] + (b'' if rest.startswith(b'}') else b',') + rest


def as_bytes(body: ops.Body) -> bytes:
    if isinstance(body, Mapping):
        return json.dumps(dict(body), separators=(',', ':'), ensure_ascii=False).encode()
    return body.encode() if isinstance(body, str) else body


def snapshot_document(head: int | None, length: int, header: ops.Body, seq: int) -> bytes:
    """A snapshot file: the format stamp, the newest message node, the number of messages, and the
    snapshot's header (its fields but the messages) with its seq."""
    return b'{"%s":%d,"head":%s,"length":%d,"snapshot":%s}' % (
        FORMAT_KEY.encode(),
        RECORD_FORMAT_VERSION,
        b'null' if head is None else b'%d' % head,
        length,
        with_field(header, 'seq', seq),
    )


def read_snapshot(path: Path) -> tuple[int | None, int, dict[str, Any]]:
    """`(head, length, header)` of a snapshot file.

    `FileNotFoundError` when it is gone, another `OSError` when it cannot be read (a directory in
    its place, say), `Uncommitted` when it is empty (its write never reached the disk),
    `ValueError` when its content is damaged.
    """
    raw = path.read_bytes()
    if not raw.strip(b'\x00'):
        raise Uncommitted(f'snapshot file {str(path)!r} is empty: its write never reached the disk')
    try:
        document: Any = json.loads(raw)
    except ValueError as exc:
        raise ValueError(
            f'snapshot file {str(path)!r} is unparsable ({exc}): it is damaged; delete it to fall back to the '
            'previous snapshot'
        ) from None
    if not isinstance(document, dict):
        raise ValueError(f'snapshot file {str(path)!r} is unparsable: it does not hold a JSON object; delete it')
    content = cast(dict[str, Any], document)
    check_format_version(content.get(FORMAT_KEY), what=f'snapshot file {str(path)!r}')
    head, length, header = content.get('head'), content.get('length'), content.get('snapshot')
    if (
        not (head is None or (isinstance(head, int) and not isinstance(head, bool)))
        or not isinstance(length, int)
        or isinstance(length, bool)
        or length < 0
        or not isinstance(header, dict)
    ):
        raise ValueError(
            f'snapshot file {str(path)!r} is unparsable: it lacks a valid head, length or snapshot; delete it'
        )
    return head, length, cast(dict[str, Any], header)


def _started(value: object) -> datetime:
    """A record's `started_at` for ordering; `EPOCH` when it is missing or malformed (the engine
    then finds the record damaged)."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            moment = datetime.fromisoformat(value)
            return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return EPOCH


def read_run(run_id: str, path: Path) -> ops.RunRow | None:
    """The run's row from its `run.json`; a file that cannot be read is handed over as it is."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        reason = f'run record {str(path)!r} is unreadable ({type(exc).__name__}: {exc.strerror})'
        return ops.RunRow(run_id, EPOCH, None, None, ops.Unreadable(reason))
    data = json_object(raw)
    if data is None:
        return ops.RunRow(run_id, EPOCH, None, None, raw)
    conversation, parent = data.get('conversation_id'), data.get('parent_run_id')
    return ops.RunRow(
        run_id=run_id,
        started_at=_started(data.get('started_at')),
        conversation_id=conversation if isinstance(conversation, str) else None,
        parent_run_id=parent if isinstance(parent, str) else None,
        body=data,
    )


def holds_records(folder: Path) -> bool:
    """Whether a run folder holds anything but its lock file and an empty snapshots folder."""
    try:
        names = set(os.listdir(folder))
        return bool(names - {LOCK_FILE, SNAPSHOTS_DIR}) or (
            SNAPSHOTS_DIR in names and bool(os.listdir(folder / SNAPSHOTS_DIR))
        )
    except (FileNotFoundError, NotADirectoryError):
        return False
