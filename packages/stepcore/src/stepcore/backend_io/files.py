"""Crash-safe, owner-only file writes shared by the file-based backends (`step-file`, `media-disk`).

A file is replaced atomically (temporary file in the same directory, then a rename), so readers
in any process see the old content or the new, never a mix; with `sync`, the data and then the
directory entry are fsynced so the result also survives a power loss.

Everything created here is its owner's only: files `0600`, folders `0700`, whatever the process
umask (the mode is set explicitly after creation, since a umask can only remove bits).

Platforms: on Linux a file is fsynced with `fsync(2)` and a directory by opening and fsyncing it.
On macOS `fsync(2)` only hands the data to the drive, which may keep it in its cache through a
power loss: files are flushed with `fcntl(F_FULLFSYNC)` instead (falling back to `fsync` where
the file system refuses it), unless a store's `full_fsync=False` says otherwise (`using_full_fsync`).
On Windows a directory cannot be opened for fsyncing and needs not be (see `fsync_dir`); every
descriptor is opened in binary mode (`open_binary`), so bytes are stored exactly as written; the
modes above only toggle the read-only flag (the folder's ACLs protect the files there); and a file
another process has open cannot be replaced or deleted until it closes it, so `replace_file` and
`remove_file` wait a little for it (see `_retry_shared`).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Final

__all__ = (
    'DIR_MODE',
    'FILE_MODE',
    'TEMP_NAME',
    'create_file',
    'fsync_dir',
    'fsync_file',
    'make_dir',
    'open_binary',
    'remove_file',
    'replace_file',
    'using_full_fsync',
    'write_all',
    'write_atomic',
    'write_temp',
)

FILE_MODE: Final = 0o600
"""Mode of every file the file-based backends create."""
DIR_MODE: Final = 0o700
"""Mode of every folder the file-based backends create."""


_F_FULLFSYNC: Final = 51
"""`F_FULLFSYNC` of macOS's `<fcntl.h>`, for Pythons whose `fcntl` module lacks the name."""


def open_binary(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
    """`os.open(path, flags, mode)` in binary mode: with `O_BINARY` where the C runtime has one (Windows).

    A descriptor opened there without it is in text mode: a newline written becomes CR LF and a
    CR LF read becomes a newline, which would change every record's bytes (and its checksum) and
    every offset the logs keep. Elsewhere the flag does not exist and `flags` pass unchanged. Read
    when called, as every platform choice here.
    """
    return os.open(path, flags | getattr(os, 'O_BINARY', 0), mode)


_full_fsync_choice: ContextVar[bool | None] = ContextVar('stepcore_full_fsync', default=None)


@contextlib.contextmanager
def using_full_fsync(choice: bool | None) -> Iterator[None]:
    """Within the block (on this thread or task), whether `fsync_file` and `fsync_dir` flush with
    `F_FULLFSYNC`: a store's `full_fsync` option, set around its file I/O.

    `None` is the platform's default: `F_FULLFSYNC` on macOS. `False` makes macOS use its plain
    `fsync(2)`, which is faster but may leave the last writes in the drive's cache through a power
    loss (as SQLite does unless `PRAGMA fullfsync` is on). `True` asks for `F_FULLFSYNC` as `None`
    does; on systems without it (Linux, Windows) every choice is the same `fsync`.
    """
    token = _full_fsync_choice.set(choice)
    try:
        yield
    finally:
        _full_fsync_choice.reset(token)


def _flush_fully() -> bool:
    """Whether a file or folder fsynced now is flushed with `F_FULLFSYNC` (see `using_full_fsync`)."""
    return sys.platform == 'darwin' and _full_fsync_choice.get() is not False


def fsync_file(fd: int) -> None:
    """Make the data written to the file open as `fd` durable: `F_FULLFSYNC` on macOS (unless the
    store's `full_fsync=False` is in force, see `using_full_fsync`), else `fsync`."""
    if _flush_fully():
        _full_fsync(fd)
    else:
        os.fsync(fd)


def _full_fsync(fd: int) -> None:
    """`fsync` on macOS, where `fsync(2)` leaves the data in the drive's cache: `fcntl(F_FULLFSYNC)`
    asks the drive to write it to the medium. File systems that refuse it (some network or FUSE
    ones) get a plain `fsync`."""
    import fcntl

    try:
        fcntl.fcntl(fd, getattr(fcntl, 'F_FULLFSYNC', _F_FULLFSYNC))
    except OSError:
        os.fsync(fd)


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` (creations, renames) durable.

    A no-op on Windows (see `_fsync_dir_windows`); elsewhere the directory is opened and fsynced.
    """
    if sys.platform == 'win32':
        _fsync_dir_windows(path)
    else:
        _fsync_dir_posix(path)


def _fsync_dir_posix(path: Path) -> None:
    fd = open_binary(path, os.O_RDONLY)
    try:
        if _flush_fully():
            _full_fsync(fd)
        else:
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir_windows(path: Path) -> None:
    """Nothing to do on Windows, where opening a directory with `os.open` fails (`PermissionError`).

    NTFS journals its metadata: a creation or a rename (`MoveFileEx`, behind `os.replace`) is
    recorded in the volume's log and is not lost on its own after it returned. What the crash rule
    needs besides, the content of a renamed file, is flushed before the rename: `write_temp`
    fsyncs the temporary file (`FlushFileBuffers`) before `write_atomic` renames it.
    """
    del path


def _mkdir(path: Path) -> bool:
    try:
        path.mkdir(mode=DIR_MODE)
    except FileExistsError:
        return False
    os.chmod(path, DIR_MODE)
    return True


def make_dir(path: Path) -> bool:
    """Create the folder `path` (and missing parents, each `0700`), fsyncing each parent that gained an entry.

    Returns True when `path` was created by this call.
    """
    try:
        created = _mkdir(path)
    except FileNotFoundError:
        make_dir(path.parent)
        created = _mkdir(path)
    if created:
        fsync_dir(path.parent)
    return created


def create_file(path: Path, flags: int) -> int:
    """Open `path`, which must not exist, creating it `0600`; returns the descriptor.

    `FileExistsError` when it exists (`O_EXCL`).
    """
    fd = open_binary(path, flags | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        _set_mode(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _set_mode(fd: int, path: Path) -> None:
    if hasattr(os, 'fchmod'):
        os.fchmod(fd, FILE_MODE)
    else:  # Windows before Python 3.13: the mode only sets the read-only flag, which 0600 leaves clear
        os.chmod(path, FILE_MODE)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd`, however many `os.write` calls that takes."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


TEMP_NAME: Final = re.compile(r'\..+\.[0-9a-f]{32}\.tmp')
"""The name of a file `write_temp` creates: one that is still there after its write ended was
left by a process killed between creating and renaming it."""


def write_temp(path: Path, data: bytes, *, sync: bool = True) -> Path:
    """Write `data` to a fresh `0600` temporary file next to `path` (fsynced when `sync`) and return its path."""
    tmp = path.with_name(f'.{path.name}.{uuid.uuid4().hex}.tmp')
    fd = create_file(tmp, os.O_WRONLY)
    try:
        write_all(fd, data)
        if sync:
            fsync_file(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def write_atomic(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace `path` with `data` atomically: temp file in the same directory, rename. The file is `0600`.

    Other processes only ever see the old or the new content. With `sync`, the content is fsynced
    before the rename and the directory after it, so the new file also survives a power loss.
    """
    tmp = write_temp(path, data, sync=sync)
    try:
        replace_file(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)


# -- replacing and removing files others may have open -------------------------------------------

_SHARING_ERRORS: Final = frozenset({5, 32})
"""Windows' ERROR_ACCESS_DENIED and ERROR_SHARING_VIOLATION: what renaming or deleting a file that
another handle holds open without delete sharing (every file Python opens) fails with."""
_SHARED_TRIES: Final = 10
"""Attempts in all: the waits between them double from `_FIRST_WAIT` to `_MOST_WAIT`, about 2 s in all."""
_FIRST_WAIT: Final = 0.01
_MOST_WAIT: Final = 0.5


def replace_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """`os.replace(src, dst)`, which on Windows waits a little for other handles of either file to close.

    On POSIX systems a file can be renamed (or replaced) while other processes read it: they keep
    reading what they opened. On Windows the rename fails while any handle is open on it without
    delete sharing (a reader in another process, a virus scanner, a search indexer), so the call is
    retried with growing waits; when that handle stays open, `PermissionError` names both paths.
    Also for renaming a file or folder to a fresh name. The waits sleep on the calling thread (the
    event loop's, for a short write a store runs inline): about two seconds at most, on Windows only.
    """
    if sys.platform == 'win32':
        _retry_shared(lambda: os.replace(src, dst), 'replace', src, dst)
    else:
        os.replace(src, dst)


def remove_file(path: str | os.PathLike[str], *, missing_ok: bool = False) -> None:
    """`os.unlink(path)`, which on Windows waits a little for other handles of the file to close
    (see `replace_file`). With `missing_ok`, a file that is not there is no error."""
    try:
        if sys.platform == 'win32':
            _retry_shared(lambda: os.unlink(path), 'delete', path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


def _sharing_violation(error: OSError) -> bool:
    return isinstance(error, PermissionError) and getattr(error, 'winerror', None) in _SHARING_ERRORS


def _retry_shared(
    action: Callable[[], object],
    verb: str,
    path: str | os.PathLike[str],
    other: str | os.PathLike[str] | None = None,
) -> None:
    """`action()`, made again while it fails with a Windows sharing violation, `_SHARED_TRIES` times
    at most; any other error at once. The last violation is raised as a `PermissionError` that says
    what to do, naming `path` (and `other`)."""
    wait = _FIRST_WAIT
    waited = 0.0
    for attempt in range(1, _SHARED_TRIES + 1):
        try:
            action()
            return
        except PermissionError as error:
            if not _sharing_violation(error):
                raise
            if attempt == _SHARED_TRIES:
                raise PermissionError(
                    error.errno,
                    f'cannot {verb} the file: another program still has it open after {attempt} tries over '
                    f'{waited:.1f} s (a Windows sharing violation, winerror {getattr(error, "winerror", None)}); '
                    'find what holds it (another process reading the store, a virus scanner, a backup or search '
                    'indexer), let it close the file and try again',
                    os.fspath(path),
                    None,
                    None if other is None else os.fspath(other),
                ) from error
        time.sleep(wait)
        waited += wait
        wait = min(wait * 2, _MOST_WAIT)
