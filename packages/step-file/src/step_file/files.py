"""Low-level file helpers: per-run locks and append-only JSON-lines logs.

Atomic writes and directory fsyncs come from `stepcore.fileio` (shared with `media-disk`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stepcore.fileio import fsync_dir, write_all

__all__ = (
    'JsonlCursor',
    'append_lines',
    'catch_up',
    'opened_log',
    'read_complete_lines',
    'run_lock',
)

logger = logging.getLogger('step_file')


@contextlib.contextmanager
def run_lock(lock_path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold `flock` on a run's lock file: exclusive for writers, shared for readers.

    A reader whose lock file does not exist (nothing was ever written) proceeds without a lock.
    """
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT if exclusive else os.O_RDONLY, 0o644)
    except FileNotFoundError:
        if exclusive:
            raise
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@dataclass(slots=True)
class JsonlCursor:
    """How far this process has read one append-only `.jsonl` file.

    `offset` always sits just after a complete line. When the file's inode changes or it becomes
    shorter than `offset`, the file was replaced and is read again from the start.
    """

    offset: int = 0
    inode: int | None = None


def _torn_tail(path: Path, size: int, end: int) -> None:
    logger.warning(
        'step_file: %s ends with an incomplete line (%d bytes, left by an interrupted write); it is ignored',
        path,
        size - end,
    )


def catch_up(fd: int, path: Path, cursor: JsonlCursor, *, repair: bool) -> tuple[list[bytes], bool]:
    """Complete lines appended to the file since `cursor`, and whether the file was read from scratch.

    A trailing incomplete line (a write cut short by a crash) is not returned; with `repair=True`
    (the caller holds the run's exclusive lock, so no write is in progress) it is truncated away so
    the next append starts on a clean line.
    """
    st = os.fstat(fd)
    reset = False
    if cursor.inode != st.st_ino or st.st_size < cursor.offset:
        cursor.inode = st.st_ino
        cursor.offset = 0
        reset = True
    if st.st_size == cursor.offset:
        return [], reset
    data = os.pread(fd, st.st_size - cursor.offset, cursor.offset)
    end = data.rfind(b'\n') + 1
    if end < len(data):
        _torn_tail(path, len(data), end)
        if repair:
            os.ftruncate(fd, cursor.offset + end)
            os.fsync(fd)
            logger.warning('step_file: truncated the incomplete last line of %s', path)
    lines = data[:end].split(b'\n')
    lines.pop()  # the empty string after the final newline
    cursor.offset += end
    return lines, reset


@contextlib.contextmanager
def opened_log(path: Path) -> Iterator[int]:
    """An append-only log open for reading and appending, created (and its directory fsynced) if
    needed, and closed when the block ends."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except FileNotFoundError:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        fsync_dir(path.parent)
    try:
        yield fd
    finally:
        os.close(fd)


def append_lines(fd: int, cursor: JsonlCursor, data: bytes, *, sync: bool) -> None:
    """Append complete lines (`data` ends with a newline), fsyncing when `sync`.

    Call right after `catch_up(repair=True)`, with the run's exclusive lock held.
    """
    write_all(fd, data)
    if sync:
        os.fsync(fd)
    cursor.offset += len(data)


def read_complete_lines(path: Path) -> list[bytes]:
    """Every complete line of a `.jsonl` file (an incomplete last line is logged and ignored)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    end = data.rfind(b'\n') + 1
    if end < len(data):
        _torn_tail(path, len(data), end)
    lines = data[:end].split(b'\n')
    lines.pop()
    return lines
