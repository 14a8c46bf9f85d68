"""Per-run locks and append-only JSON-lines logs, with owner-only files.

Every log of a run folder (events, ledger, snapshot keys, message nodes) is a `Log`: a file that
only grows by complete lines, and a *fold* of its lines (whatever this process keeps of it: the
next seq, the keys seen, ...), which a catch-up feeds with the lines appended since the last one.
Atomic writes and folder creation come from `stepcore.backend` (shared with `media-disk`).

The run lock is `flock` on POSIX systems and `LockFileEx` on Windows, chosen when it is taken (see
`lock_fd`); both are released by closing the descriptor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from stepcore.backend import (
    WouldBlock,
    create_file,
    fsync_dir,
    fsync_file,
    open_binary,
    running_inline,
    write_all,
)

__all__ = ('Fold', 'Log', 'lock_fd', 'run_lock')

logger = logging.getLogger('step_file')

_LOCK_ATTEMPTS = 100


_GENERATION_BYTES = 32


def lock_fd(fd: int, *, exclusive: bool, blocking: bool) -> None:
    """Lock the whole file open as `fd`, shared or `exclusive`, for as long as it stays open.

    Waits for another process's conflicting lock when `blocking`, else raises `WouldBlock`.
    `flock` on POSIX systems, `LockFileEx` on Windows.
    """
    if sys.platform == 'win32':
        _lock_windows(fd, exclusive=exclusive, blocking=blocking)
    else:
        _lock_posix(fd, exclusive=exclusive, blocking=blocking)


def _lock_posix(fd: int, *, exclusive: bool, blocking: bool) -> None:
    import fcntl

    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        raise WouldBlock from None


_LOCKFILE_FAIL_IMMEDIATELY = 0x1
_LOCKFILE_EXCLUSIVE_LOCK = 0x2
_ERROR_LOCK_VIOLATION = 33
_WHOLE_FILE = 0xFFFFFFFF  # the low and the high 32 bits of the locked length: every byte there can be


def _lock_windows(fd: int, *, exclusive: bool, blocking: bool) -> None:
    """`LockFileEx` on the file's handle, over every byte it can have. Closing the descriptor (the
    last handle of the file object) releases it, as with `flock`."""
    import ctypes
    import msvcrt

    windows: Any = ctypes  # `WinDLL`, `get_last_error` and `WinError` exist on Windows only

    class _Overlapped(ctypes.Structure):  # OVERLAPPED: offset 0, the lock starts at the first byte
        _fields_ = (  # pyright: ignore[reportUnannotatedClassAttribute]
            ('Internal', ctypes.c_void_p),
            ('InternalHigh', ctypes.c_void_p),
            ('Offset', ctypes.c_uint32),
            ('OffsetHigh', ctypes.c_uint32),
            ('hEvent', ctypes.c_void_p),
        )

    flags = (_LOCKFILE_EXCLUSIVE_LOCK if exclusive else 0) | (0 if blocking else _LOCKFILE_FAIL_IMMEDIATELY)
    handle: int = getattr(msvcrt, 'get_osfhandle')(fd)  # noqa: B009 - Windows only
    overlapped = _Overlapped()
    kernel32 = windows.WinDLL('kernel32', use_last_error=True)
    whole = ctypes.c_uint32(_WHOLE_FILE)
    if kernel32.LockFileEx(
        ctypes.c_void_p(handle), ctypes.c_uint32(flags), ctypes.c_uint32(0), whole, whole, ctypes.byref(overlapped)
    ):
        return
    error: int = windows.get_last_error()
    if error == _ERROR_LOCK_VIOLATION:
        raise WouldBlock
    raise windows.WinError(error)


def _pread(fd: int, size: int, offset: int) -> bytes:
    """`os.pread`, or a seek and a read where there is none (Windows); the descriptors here are this call's own."""
    if hasattr(os, 'pread'):
        return os.pread(fd, size, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.read(fd, size)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b''.join(chunks)


@contextlib.contextmanager
def run_lock(path: Path, *, exclusive: bool, prepare: Callable[[], object] | None = None) -> Iterator[bytes]:
    """Hold `flock` on a run's lock file `path`: exclusive for writers, shared for readers.

    A writer creates the lock file (`0600`), calling `prepare()` first when its folder is missing.
    A reader whose lock file does not exist (nothing was ever written, or the run was deleted)
    proceeds without a lock. A lock taken on a file that was removed meanwhile (the run was
    deleted while this process waited) is taken again on the file now at `path`.

    Yields the folder's *generation*: random bytes written into the lock file when it is created
    (empty for folders older than that, or when there is no lock file). A run folder deleted and
    made again has another generation, so what a process remembers of the old one is dropped even
    when the new files happen to reuse the old ones' inode numbers.
    """
    fd = _acquire(path, exclusive, prepare)
    try:
        yield b'' if fd is None else _pread(fd, _GENERATION_BYTES, 0)
    finally:
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock


def _acquire(path: Path, exclusive: bool, prepare: Callable[[], object] | None) -> int | None:
    for _ in range(_LOCK_ATTEMPTS):
        try:
            fd = _open_lock(path, exclusive)
        except FileNotFoundError:
            if not exclusive:
                return None
            if prepare is None:
                raise
            prepare()
            continue
        try:
            # Held by another process, a call that must not wait on the event loop gets WouldBlock.
            lock_fd(fd, exclusive=exclusive, blocking=not running_inline())
            # The file index on Windows: both calls read it from the file system (CPython >= 3.5).
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the lock file was replaced or removed while we waited: lock the current one
    raise RuntimeError(f'could not lock {str(path)!r}: it kept being removed by other processes')


def _open_lock(path: Path, exclusive: bool) -> int:
    if not exclusive:
        return open_binary(path, os.O_RDONLY)
    try:
        return open_binary(path, os.O_RDWR)
    except FileNotFoundError:
        try:
            fd = create_file(path, os.O_RDWR)
        except FileExistsError:
            return open_binary(path, os.O_RDWR)
        write_all(fd, os.urandom(_GENERATION_BYTES // 2).hex().encode())
        return fd


class Fold(Protocol):
    """What a process keeps of a log: fed each complete line, in order, once."""

    def add(self, number: int, line: bytes) -> None:
        """Take in line `number` (1-based) of the file, without its newline."""
        ...


F = TypeVar('F', bound=Fold)


class Log(Generic[F]):
    """One append-only JSON-lines file, how far this process has read it, and its fold (`seen`).

    The read position always sits just after a complete line. When the file's inode changes or it
    becomes shorter than the position, it was replaced: `seen` starts afresh from `fresh()` and the
    file is read from the start. A trailing incomplete line (a write cut short by a crash) is never
    folded; a catch-up with `repair` (the run's exclusive lock is held, so no write is in progress)
    truncates it so the next append starts on a clean line.
    """

    __slots__ = ('_fresh', '_inode', '_lines', '_offset', '_unended', 'path', 'seen')

    def __init__(self, path: Path, fresh: Callable[[], F]) -> None:
        self.path = path
        self._fresh = fresh
        self.seen: F = fresh()
        self._offset = 0
        self._inode: int | None = None
        self._lines = 0
        self._unended = False
        """The last line folded is a damaged one read without `repair`: the file holds no newline
        after it yet. A writer ends it later, and that newline must not read as an empty line."""

    @contextlib.contextmanager
    def writing(self) -> Iterator[int]:
        """The file open for appending (created `0600` if missing), caught up and repaired."""
        try:
            fd = open_binary(self.path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            try:
                fd = create_file(self.path, os.O_RDWR | os.O_APPEND)
            except FileExistsError:
                fd = open_binary(self.path, os.O_RDWR | os.O_APPEND)
            else:
                fsync_dir(self.path.parent)
        try:
            self._catch_up(fd, repair=True)
            yield fd
        finally:
            os.close(fd)

    def refresh(self, *, repair: bool) -> F:
        """`seen`, caught up with the file (an empty fold when there is no file)."""
        try:
            st = os.stat(self.path)
            if st.st_ino == self._inode and st.st_size == self._offset:
                return self.seen  # nothing appended since: one stat instead of an open
            fd = open_binary(self.path, os.O_RDWR if repair else os.O_RDONLY)
        except FileNotFoundError:
            self._reset(None)
            return self.seen
        try:
            self._catch_up(fd, repair=repair)
        finally:
            os.close(fd)
        return self.seen

    def append(self, fd: int, data: bytes, *, sync: bool) -> None:
        """Append complete lines (`data` ends with a newline) to the file `writing()` opened, and fold them."""
        write_all(fd, data)
        if sync:
            fsync_file(fd)
        self._offset += len(data)
        self._fold(data)

    def lines(self) -> list[bytes]:
        """Every complete line of the file, read afresh (the position and `seen` are left as they are)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        end = self._complete(data, 0)
        lines = (data[:end] if end == len(data) or data.endswith(b'\n') else data + b'\n').split(b'\n')
        lines.pop()  # the empty string after the final newline
        return lines

    def _reset(self, inode: int | None) -> None:
        self.seen = self._fresh()
        self._inode = inode
        self._offset = 0
        self._lines = 0
        self._unended = False

    def _catch_up(self, fd: int, *, repair: bool) -> None:
        st = os.fstat(fd)
        if self._inode != st.st_ino or st.st_size < self._offset:
            self._reset(st.st_ino)
        if st.st_size == self._offset:
            return
        data = _pread(fd, st.st_size - self._offset, self._offset)
        if self._unended and data.startswith(b'\n'):
            # the newline a writer added to end the damaged line folded before: already counted
            self._offset += 1
            data = data[1:]
        self._unended = False
        if not data:
            return
        end = self._complete(data, self._offset)
        if end == len(data) and not data.endswith(b'\n'):  # a whole last line with a damaged newline
            if repair:  # end it, so the next append starts a line of its own; its bytes are kept
                os.pwrite(fd, b'\n', st.st_size)
                fsync_file(fd)
                data += b'\n'
                end += 1
            else:
                self._unended = True
            self._offset += end
            self._fold(data if data.endswith(b'\n') else data + b'\n')
            return
        if end < len(data) and repair:
            os.ftruncate(fd, self._offset + end)
            fsync_file(fd)
            logger.warning('step_file: truncated the incomplete last line of %s', self.path)
        self._offset += end
        self._fold(data[:end])

    def _complete(self, data: bytes, start: int) -> int:
        """How many leading bytes of `data` (read at `start`) are complete lines; warns about the rest.

        A write cut short leaves a prefix of what it wrote (or zeros after it). A last line that is
        a whole JSON object followed by one byte other than its newline is not that: its newline
        was damaged, and the line is complete (all of `data`), so reading it reports the damage
        instead of taking the record for one a crash lost.
        """
        end = data.rfind(b'\n') + 1
        tail = data[end:]
        if len(tail) >= 2 and tail[-2:-1] == b'}' and tail[-1:] not in (b'\n', b'\x00') and tail[:1] == b'{':
            logger.warning(
                'step_file: the last line of %s (offset %d) ends with %r where its newline belongs: it is damaged',
                self.path,
                start + end,
                tail[-1:],
            )
            return len(data)
        if end < len(data):
            logger.warning(
                'step_file: %s ends with an incomplete line (%d bytes at offset %d, left by an interrupted write); '
                'it is ignored',
                self.path,
                len(data) - end,
                start + end,
            )
        return end

    def _fold(self, data: bytes) -> None:
        lines = data.split(b'\n')
        lines.pop()
        add = self.seen.add
        for line in lines:
            self._lines += 1
            add(self._lines, line)
