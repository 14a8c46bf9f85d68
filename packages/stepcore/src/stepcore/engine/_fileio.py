"""Crash-safe, owner-only file writes shared by the file-based backends (`step-file`, `media-disk`).

A file is replaced atomically (temporary file in the same directory, then a rename), so readers
in any process see the old content or the new, never a mix; with `sync`, the data and then the
directory entry are fsynced so the result also survives a power loss.

Everything created here is its owner's only: files `0600`, folders `0700`, whatever the process
umask (the mode is set explicitly after creation, since a umask can only remove bits).

Platforms: on Linux a file is fsynced with `fsync(2)` and a directory by opening and fsyncing it.
On macOS `fsync(2)` only hands the data to the drive, which may keep it in its cache through a
power loss: files are flushed with `fcntl(F_FULLFSYNC)` instead (falling back to `fsync` where
the file system refuses it). On Windows a directory cannot be opened for fsyncing and needs not
be (see `fsync_dir`); files are opened in binary mode so bytes are stored exactly as written, and
the modes above only toggle the read-only flag (the folder's ACLs protect the files there).
"""

from __future__ import annotations

import os
import re
import sys
import uuid
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
    'write_all',
    'write_atomic',
    'write_temp',
)

FILE_MODE: Final = 0o600
"""Mode of every file the file-based backends create."""
DIR_MODE: Final = 0o700
"""Mode of every folder the file-based backends create."""


_BINARY: Final = getattr(os, 'O_BINARY', 0)
"""`O_BINARY` where the C runtime has text-mode descriptors (Windows), else 0."""
_F_FULLFSYNC: Final = 51
"""`F_FULLFSYNC` of macOS's `<fcntl.h>`, for Pythons whose `fcntl` module lacks the name."""


def fsync_file(fd: int) -> None:
    """Make the data written to the file open as `fd` durable (`F_FULLFSYNC` on macOS, else `fsync`)."""
    if sys.platform == 'darwin':
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
    fd = os.open(path, os.O_RDONLY)
    try:
        if sys.platform == 'darwin':
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
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | _BINARY, FILE_MODE)
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
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)
