"""The disk media store's files on Windows and macOS, simulated on any system: blobs and sidecars
opened in binary mode, collection that waits for a reader's handle to close, and the `full_fsync`
option that trades macOS's `F_FULLFSYNC` for its plain `fsync`."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from media_disk import DiskMediaStore
from stepcore.media import MediaContext, digest_of_uri

O_BINARY = 0x4000_0000
"""A stand-in for Windows' `O_BINARY`: a bit no Linux or macOS `open` flag uses."""
DATA = b'line one\r\nline two\n\x1a\x00'
"""Bytes a text-mode descriptor would change: CR LF, LF, and Ctrl-Z."""


async def test_blobs_and_sidecars_are_written_in_binary_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, 'O_BINARY', O_BINARY, raising=False)
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def open_(path: str | os.PathLike[str], flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        opened.append((os.fspath(path), flags))
        return real_open(path, flags & ~O_BINARY, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, 'open', open_)
    store = DiskMediaStore(tmp_path)
    uri = await store.put(DATA, context=MediaContext(media_type='text/plain', metadata={'from': 'test'}))
    written = [(Path(path).name, flags) for path, flags in opened if not os.path.isdir(path)]
    digest = digest_of_uri(uri)
    assert [name.split('.')[1:3] for name, _ in written] == [[digest, 'bin'], [digest, 'bin']]  # blob, sidecar
    assert all(flags & O_BINARY for _, flags in written)
    assert await store.get(uri) == DATA


class Sharing:
    """`os.replace` and `os.unlink` failing as on Windows while another process reads the file: the
    calls numbered in `refuse` (from 1, both kinds counted together) raise `PermissionError` with
    `winerror` 32 (a sharing violation), or `winerror` when set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.refuse: set[int] = set()
        self.winerror = 32
        self.calls: list[str] = []
        self.refused: list[str] = []
        self.waits: list[float] = []
        real = {'replace': os.replace, 'unlink': os.unlink}

        def wrap(name: str) -> Any:
            def call(*args: Any) -> None:
                self.calls.append(name)
                if len(self.calls) in self.refuse:
                    self.refused.append(name)
                    error = PermissionError(13, 'The process cannot access the file because it is being used')
                    error.winerror = self.winerror  # type: ignore[attr-defined]  # set by Windows' OSError
                    raise error
                real[name](*args)

            return call

        monkeypatch.setattr(sys, 'platform', 'win32')
        monkeypatch.setattr(os, 'replace', wrap('replace'))
        monkeypatch.setattr(os, 'unlink', wrap('unlink'))
        monkeypatch.setattr('stepcore.backend_io.files.time.sleep', self.waits.append)


async def test_collecting_a_blob_a_reader_holds_open_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(DATA, context=MediaContext(metadata={'k': 'v'}))
    blob = store.path_for(uri)
    windows = Sharing(monkeypatch)
    windows.refuse = {1, 2}  # the rename aside, twice
    assert await store.delete_media(uri)
    assert windows.refused == ['replace', 'replace']
    assert windows.calls == ['replace'] * 3 + ['unlink'] * 2  # then the blob set aside, and its sidecar
    assert windows.waits == [0.01, 0.02]
    assert not blob.exists()
    assert not store.sidecar_path(blob).exists()
    assert list(tmp_path.iterdir()) == []


async def test_a_blob_put_back_and_a_sidecar_removed_wait_for_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(DATA, context=MediaContext(metadata={'k': 'v'}))
    blob = store.path_for(uri)
    windows = Sharing(monkeypatch)
    windows.winerror = 5  # access denied: what Windows gives for a file with a delete pending, too
    windows.refuse = {2}  # the rename aside goes through, putting it back is refused once
    assert not await store.delete_media(uri, older_than=datetime(2000, 1, 1, tzinfo=UTC))  # put since: kept
    assert windows.calls == ['replace', 'replace', 'replace']
    assert blob.read_bytes() == DATA
    windows.calls.clear()
    windows.refuse = {2, 4}  # the removal of the copy set aside, then of the sidecar
    assert await store.delete_media(uri)
    assert windows.calls == ['replace', 'unlink', 'unlink', 'unlink', 'unlink']
    assert windows.refused == ['replace', 'unlink', 'unlink']
    assert list(tmp_path.iterdir()) == []


async def test_a_blob_that_stays_open_fails_collection_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(DATA)
    windows = Sharing(monkeypatch)
    windows.refuse = set(range(1, 11))
    with pytest.raises(PermissionError, match='another program still has it open after 10 tries') as raised:
        await store.delete_media(uri)
    assert raised.value.filename == str(store.path_for(uri))
    assert len(windows.waits) == 9
    assert await store.get(uri) == DATA  # still there, for the next collection


async def test_a_permission_error_other_than_sharing_is_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(DATA)
    windows = Sharing(monkeypatch)
    windows.winerror = 1920  # ERROR_CANT_ACCESS_FILE: no other handle to wait for
    windows.refuse = {1}
    with pytest.raises(PermissionError, match='being used'):
        await store.delete_media(uri)
    assert windows.waits == []


class MacFcntl:
    F_FULLFSYNC = 51

    def __init__(self) -> None:
        self.full: list[int] = []

    def fcntl(self, fd: int, cmd: int) -> int:
        assert cmd == self.F_FULLFSYNC
        self.full.append(fd)
        return 0


@pytest.mark.parametrize(('full_fsync', 'full'), [(None, True), (True, True), (False, False)])
async def test_darwin_full_fsync_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full_fsync: bool | None, full: bool
) -> None:
    monkeypatch.setattr(sys, 'platform', 'darwin')
    fake = MacFcntl()
    monkeypatch.setitem(sys.modules, 'fcntl', fake)
    fsynced: list[int] = []
    monkeypatch.setattr(os, 'fsync', fsynced.append)
    store = DiskMediaStore(tmp_path, full_fsync=full_fsync)
    uri = await store.put(DATA, context=MediaContext(metadata={'k': 'v'}))
    assert await store.get(uri) == DATA
    # the blob and its folder, the sidecar and its folder
    assert (len(fake.full), len(fsynced)) == ((4, 0) if full else (0, 4))


def test_full_fsync_must_be_a_bool_or_none(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='full_fsync=1 must be True, False or None'):
        DiskMediaStore(tmp_path, full_fsync=1)  # type: ignore[arg-type]
