"""The Windows and macOS branches of process liveness and of the crash-safe file writes, run on any
system by simulating the platform (`sys.platform` and the system calls are replaced). Windows'
process probe itself is in test_owner_probe_scenarios.py."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stepcore.backend_io import files
from stepcore.ownership import identity


def test_windows_nonpositive_pid_is_gone_without_asking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, 'platform', 'win32')

    def ask(pid: int) -> bool:
        raise AssertionError(f'asked Windows about process {pid}')

    monkeypatch.setattr(identity, '_windows_process_alive', ask)
    assert not identity.process_alive(0)
    assert not identity.process_alive(-1)


def test_platform_is_chosen_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    assert identity.process_alive(os.getpid())  # the real platform
    monkeypatch.setattr(sys, 'platform', 'win32')

    def only_42(pid: int) -> bool:
        return pid == 42

    monkeypatch.setattr(identity, '_windows_process_alive', only_42)
    assert identity.process_alive(42)
    assert not identity.process_alive(os.getpid())


# --- directory fsync on Windows --------------------------------------------------------------


def test_windows_directory_fsync_opens_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, 'platform', 'win32')

    def refuse(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, 'Permission denied')  # what os.open does with a folder on Windows

    monkeypatch.setattr(os, 'open', refuse)
    files.fsync_dir(tmp_path)


def test_windows_atomic_write_fsyncs_the_file_before_the_rename(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, 'platform', 'win32')
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append('fsync')
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        calls.append('replace')
        real_replace(src, dst)

    monkeypatch.setattr(os, 'fsync', fsync)
    monkeypatch.setattr(os, 'replace', replace)
    files.write_atomic(tmp_path / 'f', b'data\n')
    assert calls == ['fsync', 'replace']  # the file's fsync, the rename, and no directory fsync
    assert (tmp_path / 'f').read_bytes() == b'data\n'


def test_linux_directory_fsync_is_unchanged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, 'platform', 'linux')
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, 'fsync', fsync)
    files.fsync_dir(tmp_path)
    files.write_atomic(tmp_path / 'f', b'x')
    assert len(synced) == 3  # the folder; then the file and the folder


# --- F_FULLFSYNC on macOS --------------------------------------------------------------------


class FakeFcntl:
    F_FULLFSYNC = 51

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[int, int]] = []

    def fcntl(self, fd: int, cmd: int) -> int:
        self.calls.append((fd, cmd))
        if self.fail:
            raise OSError(45, 'Operation not supported')
        return 0


@pytest.fixture
def darwin(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeFcntl, list[int]]:
    monkeypatch.setattr(sys, 'platform', 'darwin')
    fake = FakeFcntl()
    monkeypatch.setitem(sys.modules, 'fcntl', fake)
    fsynced: list[int] = []
    monkeypatch.setattr(os, 'fsync', fsynced.append)
    return fake, fsynced


def test_darwin_file_fsync_is_a_full_fsync(darwin: tuple[FakeFcntl, list[int]], tmp_path: Path) -> None:
    fake, fsynced = darwin
    files.write_atomic(tmp_path / 'f', b'data')
    assert [cmd for _, cmd in fake.calls] == [51, 51]  # the file, then its folder
    assert fsynced == []
    assert (tmp_path / 'f').read_bytes() == b'data'


def test_darwin_falls_back_to_fsync_when_full_fsync_is_refused(
    darwin: tuple[FakeFcntl, list[int]], tmp_path: Path
) -> None:
    fake, fsynced = darwin
    fake.fail = True
    fd = os.open(tmp_path / 'f', os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        files.fsync_file(fd)
    finally:
        os.close(fd)
    assert fake.calls == [(fd, 51)]
    assert fsynced == [fd]


def test_darwin_uses_the_known_value_when_fcntl_lacks_the_name(
    darwin: tuple[FakeFcntl, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, _ = darwin
    monkeypatch.delattr(FakeFcntl, 'F_FULLFSYNC')
    files.fsync_file(5)
    assert fake.calls == [(5, 51)]


def test_linux_file_fsync_is_a_plain_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, 'platform', 'linux')
    fake = FakeFcntl()
    monkeypatch.setitem(sys.modules, 'fcntl', fake)
    fsynced: list[int] = []
    monkeypatch.setattr(os, 'fsync', fsynced.append)
    files.fsync_file(9)
    assert fsynced == [9]
    assert fake.calls == []


# --- file creation without os.fchmod (Windows before Python 3.13) -----------------------------


def test_create_file_without_fchmod_sets_the_mode_by_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delattr(os, 'fchmod', raising=False)
    chmods: list[tuple[Path, int]] = []
    real_chmod = os.chmod

    def chmod(path: Any, mode: int) -> None:
        chmods.append((Path(path), mode))
        real_chmod(path, mode)

    monkeypatch.setattr(os, 'chmod', chmod)
    fd = files.create_file(tmp_path / 'f', os.O_WRONLY)
    os.close(fd)
    assert chmods == [(tmp_path / 'f', 0o600)]
    assert (tmp_path / 'f').stat().st_mode & 0o777 == 0o600


# --- binary descriptors (Windows' O_BINARY) ----------------------------------------------------

O_BINARY = 0x4000_0000
"""A stand-in for Windows' `O_BINARY`: a bit no Linux or macOS `open` flag uses."""


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every `os.open` made, as (path, flags), with `os.O_BINARY` defined as on Windows."""
    monkeypatch.setattr(os, 'O_BINARY', O_BINARY, raising=False)
    calls: list[tuple[str, int]] = []
    real_open = os.open

    def open_(path: str | os.PathLike[str], flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        calls.append((os.fspath(path), flags))
        return real_open(path, flags & ~O_BINARY, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, 'open', open_)
    return calls


def test_open_binary_adds_o_binary_where_it_exists(opened: list[tuple[str, int]], tmp_path: Path) -> None:
    (tmp_path / 'f').write_bytes(b'a\r\nb\n')
    fd = files.open_binary(tmp_path / 'f', os.O_RDONLY)
    try:
        assert os.read(fd, 100) == b'a\r\nb\n'
    finally:
        os.close(fd)
    assert opened == [(str(tmp_path / 'f'), os.O_RDONLY | O_BINARY)]


def test_open_binary_leaves_the_flags_where_there_is_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delattr(os, 'O_BINARY', raising=False)
    seen: list[int] = []
    real_open = os.open

    def open_(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        seen.append(flags)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, 'open', open_)
    os.close(files.open_binary(tmp_path / 'g', os.O_WRONLY | os.O_CREAT, 0o600))
    assert seen == [os.O_WRONLY | os.O_CREAT]


def test_atomic_writes_open_every_file_in_binary_mode(opened: list[tuple[str, int]], tmp_path: Path) -> None:
    files.write_atomic(tmp_path / 'f', b'line\r\n')
    os.close(files.create_file(tmp_path / 'g', os.O_WRONLY))
    made = [(Path(path).name, flags) for path, flags in opened if not os.path.isdir(path)]
    assert [name.startswith('.f.') for name, _ in made] == [True, False]  # the temporary file, then g
    assert all(flags & O_BINARY and flags & os.O_EXCL for _, flags in made)
    assert (tmp_path / 'f').read_bytes() == b'line\r\n'


# --- replacing and removing files another handle holds open (Windows) --------------------------


class Sharing:
    """`os.replace` and `os.unlink` that fail `fail` times with the given Windows error, then work."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fail: int, winerror: int | None = 32) -> None:
        self.fail = fail
        self.winerror = winerror
        self.calls = 0
        self.waits: list[float] = []
        real = {'replace': os.replace, 'unlink': os.unlink}

        def wrap(name: str) -> Any:
            def call(*args: Any) -> None:
                self.calls += 1
                if self.fail:
                    self.fail -= 1
                    error = PermissionError(13, 'The process cannot access the file because it is being used')
                    if self.winerror is not None:
                        error.winerror = self.winerror  # type: ignore[attr-defined]  # set by Windows' OSError
                    raise error
                real[name](*args)

            return call

        monkeypatch.setattr(os, 'replace', wrap('replace'))
        monkeypatch.setattr(os, 'unlink', wrap('unlink'))
        monkeypatch.setattr(time, 'sleep', self.waits.append)


@pytest.mark.parametrize('winerror', [32, 5])
def test_windows_replace_waits_for_a_sharing_violation_to_pass(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, winerror: int
) -> None:
    monkeypatch.setattr(sys, 'platform', 'win32')
    (tmp_path / 'new').write_bytes(b'new')
    (tmp_path / 'old').write_bytes(b'old')
    sharing = Sharing(monkeypatch, fail=4, winerror=winerror)
    files.replace_file(tmp_path / 'new', tmp_path / 'old')
    assert sharing.calls == 5
    assert sharing.waits == [0.01, 0.02, 0.04, 0.08]
    assert (tmp_path / 'old').read_bytes() == b'new'


def test_windows_atomic_write_waits_for_a_reader_of_the_old_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, 'platform', 'win32')
    (tmp_path / 'f').write_bytes(b'old')
    sharing = Sharing(monkeypatch, fail=2)
    files.write_atomic(tmp_path / 'f', b'new')
    assert sharing.waits == [0.01, 0.02]
    assert (tmp_path / 'f').read_bytes() == b'new'


def test_windows_remove_waits_for_a_sharing_violation_to_pass(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, 'platform', 'win32')
    (tmp_path / 'f').write_bytes(b'x')
    sharing = Sharing(monkeypatch, fail=3)
    files.remove_file(tmp_path / 'f')
    assert sharing.calls == 4
    assert not (tmp_path / 'f').exists()


def test_windows_gives_up_after_ten_tries_naming_the_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, 'platform', 'win32')
    (tmp_path / 'new').write_bytes(b'new')
    sharing = Sharing(monkeypatch, fail=1000)
    with pytest.raises(PermissionError) as raised:
        files.replace_file(tmp_path / 'new', tmp_path / 'old')
    error = raised.value
    assert (error.filename, error.filename2) == (str(tmp_path / 'new'), str(tmp_path / 'old'))
    assert 'cannot replace the file: another program still has it open after 10 tries over 2.1 s' in str(error)
    assert 'winerror 32' in str(error)
    assert isinstance(error.__cause__, PermissionError)
    assert sharing.calls == 10
    assert sharing.waits == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5, 0.5]
    with pytest.raises(PermissionError, match='cannot delete the file') as removing:
        files.remove_file(tmp_path / 'new')
    assert (removing.value.filename, removing.value.filename2) == (str(tmp_path / 'new'), None)


@pytest.mark.parametrize('winerror', [None, 1920])
def test_windows_other_permission_errors_are_raised_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, winerror: int | None
) -> None:
    monkeypatch.setattr(sys, 'platform', 'win32')
    sharing = Sharing(monkeypatch, fail=1, winerror=winerror)
    with pytest.raises(PermissionError, match='being used'):
        files.remove_file(tmp_path / 'f')
    assert sharing.waits == []


def test_linux_never_waits_on_a_permission_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, 'platform', 'linux')
    sharing = Sharing(monkeypatch, fail=1)  # even one that looks like a sharing violation
    with pytest.raises(PermissionError):
        files.replace_file(tmp_path / 'a', tmp_path / 'b')
    assert (sharing.calls, sharing.waits) == (1, [])


def test_remove_file_missing_ok(tmp_path: Path) -> None:
    files.remove_file(tmp_path / 'absent', missing_ok=True)
    with pytest.raises(FileNotFoundError):
        files.remove_file(tmp_path / 'absent')


# --- the full_fsync choice --------------------------------------------------------------------


@pytest.mark.parametrize(('choice', 'full'), [(None, True), (True, True), (False, False)])
def test_darwin_full_fsync_choice(
    darwin: tuple[FakeFcntl, list[int]], tmp_path: Path, choice: bool | None, full: bool
) -> None:
    fake, fsynced = darwin
    with files.using_full_fsync(choice):
        files.write_atomic(tmp_path / 'f', b'data')  # the file, then its folder
    assert (len(fake.calls), len(fsynced)) == ((2, 0) if full else (0, 2))
    files.write_atomic(tmp_path / 'g', b'data')  # outside the block: the platform's default again
    assert (len(fake.calls), len(fsynced)) == ((4, 0) if full else (2, 2))


def test_linux_full_fsync_choice_changes_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, 'platform', 'linux')
    fake = FakeFcntl()
    monkeypatch.setitem(sys.modules, 'fcntl', fake)
    fsynced: list[int] = []
    monkeypatch.setattr(os, 'fsync', fsynced.append)
    with files.using_full_fsync(True):
        files.write_atomic(tmp_path / 'f', b'data')
    assert (len(fake.calls), len(fsynced)) == (0, 2)
