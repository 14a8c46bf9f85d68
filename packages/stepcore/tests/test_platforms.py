"""The Windows and macOS branches of process liveness and of the crash-safe file writes, run on any
system by simulating the platform (`sys.platform` and the system calls are replaced)."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from stepcore.engine import _fileio
from stepcore.ownership import identity

STILL_ACTIVE = 259


class FakeKernel32:
    """`OpenProcess` / `GetLastError` / `GetExitCodeProcess` / `CloseHandle` of a simulated Windows."""

    def __init__(self, *, handle: int = 7, error: int = 0, exit_code: int = STILL_ACTIVE, exit_ok: bool = True) -> None:
        self.handle = handle
        self.error = error
        self.exit_code = exit_code
        self.exit_ok = exit_ok
        self.opened: list[tuple[int, bool, int]] = []
        self.closed: list[int] = []

    def OpenProcess(self, access: int, inherit: bool, pid: int) -> int:
        self.opened.append((access, inherit, pid))
        return self.handle

    def GetLastError(self) -> int:
        return self.error

    def GetExitCodeProcess(self, handle: int, code: Any) -> int:
        assert handle == self.handle
        if not self.exit_ok:
            return 0
        code._obj.value = self.exit_code
        return 1

    def CloseHandle(self, handle: int) -> int:
        self.closed.append(handle)
        return 1


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Simulate Windows for `process_alive`; the fixture sets the fake kernel32 it returns."""
    monkeypatch.setattr(sys, 'platform', 'win32')

    def no_kill(pid: int, sig: int) -> None:
        raise AssertionError('os.kill must not be called on Windows: it would terminate the process')

    monkeypatch.setattr(os, 'kill', no_kill)

    def use(kernel32: FakeKernel32) -> FakeKernel32:
        monkeypatch.setattr(ctypes, 'windll', type('windll', (), {'kernel32': kernel32})(), raising=False)
        return kernel32

    return use


def test_windows_running_process_is_alive(windows: Any) -> None:
    kernel32 = windows(FakeKernel32(exit_code=STILL_ACTIVE))
    assert identity.process_alive(1234)
    assert kernel32.opened == [(0x1000, False, 1234)]
    assert kernel32.closed == [7]


def test_windows_exited_process_is_gone(windows: Any) -> None:
    kernel32 = windows(FakeKernel32(exit_code=0))
    assert not identity.process_alive(1234)
    assert kernel32.closed == [7]


def test_windows_process_not_ours_to_open_is_alive(windows: Any) -> None:
    kernel32 = windows(FakeKernel32(handle=0, error=5))
    assert identity.process_alive(1234)
    assert kernel32.closed == []


def test_windows_no_such_process_is_gone(windows: Any) -> None:
    windows(FakeKernel32(handle=0, error=87))
    assert not identity.process_alive(1234)


def test_windows_unreadable_exit_code_is_alive(windows: Any) -> None:
    kernel32 = windows(FakeKernel32(exit_ok=False))
    assert identity.process_alive(1234)
    assert kernel32.closed == [7]


def test_windows_nonpositive_pid_is_gone_without_a_system_call(windows: Any) -> None:
    kernel32 = windows(FakeKernel32())
    assert not identity.process_alive(0)
    assert kernel32.opened == []


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
    _fileio.fsync_dir(tmp_path)


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
    _fileio.write_atomic(tmp_path / 'f', b'data\n')
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
    _fileio.fsync_dir(tmp_path)
    _fileio.write_atomic(tmp_path / 'f', b'x')
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
    _fileio.write_atomic(tmp_path / 'f', b'data')
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
        _fileio.fsync_file(fd)
    finally:
        os.close(fd)
    assert fake.calls == [(fd, 51)]
    assert fsynced == [fd]


def test_darwin_uses_the_known_value_when_fcntl_lacks_the_name(
    darwin: tuple[FakeFcntl, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, _ = darwin
    monkeypatch.delattr(FakeFcntl, 'F_FULLFSYNC')
    _fileio.fsync_file(5)
    assert fake.calls == [(5, 51)]


def test_linux_file_fsync_is_a_plain_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, 'platform', 'linux')
    fake = FakeFcntl()
    monkeypatch.setitem(sys.modules, 'fcntl', fake)
    fsynced: list[int] = []
    monkeypatch.setattr(os, 'fsync', fsynced.append)
    _fileio.fsync_file(9)
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
    fd = _fileio.create_file(tmp_path / 'f', os.O_WRONLY)
    os.close(fd)
    assert chmods == [(tmp_path / 'f', 0o600)]
    assert (tmp_path / 'f').stat().st_mode & 0o777 == 0o600
