"""Crash-safe file writes shared by the file-based backends (`step-file`, `media-disk`).

A file is replaced atomically (temporary file in the same directory, then a rename), so readers
in any process see the old content or the new, never a mix; with `sync`, the data and then the
directory entry are fsynced so the result also survives a power loss.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

__all__ = ('fsync_dir', 'make_dir', 'write_all', 'write_atomic', 'write_temp')


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir(path: Path) -> bool:
    """Create `path` (and missing parents), fsyncing each parent that gained an entry.

    Returns True when `path` was created by this call.
    """
    try:
        path.mkdir()
    except FileExistsError:
        return False
    except FileNotFoundError:
        make_dir(path.parent)
        try:
            path.mkdir()
        except FileExistsError:
            return False
    fsync_dir(path.parent)
    return True


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` to `fd`, however many `os.write` calls that takes."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_temp(path: Path, data: bytes, *, sync: bool = True) -> Path:
    """Write `data` to a fresh temporary file next to `path` (fsynced when `sync`) and return its path."""
    tmp = path.with_name(f'.{path.name}.{uuid.uuid4().hex}.tmp')
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def write_atomic(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace `path` with `data` atomically: temp file in the same directory, rename.

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
