"""The run lock's platform layer: `flock` on POSIX systems, `LockFileEx` on Windows (simulated here
with stand-in `msvcrt` and `ctypes` modules), and an import of `step_file` without `fcntl`."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from step_file import files
from stepcore.backend import WouldBlock

LOCKFILE_FAIL_IMMEDIATELY = 0x1
LOCKFILE_EXCLUSIVE_LOCK = 0x2
ERROR_LOCK_VIOLATION = 33


class FakeKernel32:
    def __init__(self, system: FakeWindows) -> None:
        self.system = system

    def LockFileEx(self, handle: Any, flags: Any, reserved: Any, low: Any, high: Any, overlapped: Any) -> int:
        self.system.locks.append(
            {
                'handle': handle.value,
                'flags': flags.value,
                'reserved': reserved.value,
                'low': low.value,
                'high': high.value,
            }
        )
        assert overlapped._obj.Offset == 0
        assert overlapped._obj.OffsetHigh == 0
        if self.system.error:
            return 0
        return 1


class FakeWindows:
    """Stand-ins for `msvcrt` and the `ctypes` names the lock uses, recording the calls."""

    def __init__(self) -> None:
        self.locks: list[dict[str, int]] = []
        self.error = 0
        self.handles: list[int] = []
        self.msvcrt = types.ModuleType('msvcrt')
        self.msvcrt.get_osfhandle = self._get_osfhandle  # type: ignore[attr-defined]
        self.ctypes = types.ModuleType('ctypes')
        for name in ('Structure', 'c_void_p', 'c_uint32', 'byref'):
            setattr(self.ctypes, name, getattr(ctypes, name))
        self.ctypes.WinDLL = self._windll  # type: ignore[attr-defined]
        self.ctypes.get_last_error = lambda: self.error  # type: ignore[attr-defined]
        self.ctypes.WinError = lambda code: OSError(code, f'Windows error {code}')  # type: ignore[attr-defined]

    def _get_osfhandle(self, fd: int) -> int:
        self.handles.append(fd)
        return 1000 + fd

    def _windll(self, name: str, use_last_error: bool = False) -> FakeKernel32:
        assert name == 'kernel32'
        assert use_last_error
        return FakeKernel32(self)


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> FakeWindows:
    system = FakeWindows()
    monkeypatch.setattr(sys, 'platform', 'win32')
    monkeypatch.setitem(sys.modules, 'msvcrt', system.msvcrt)
    monkeypatch.setitem(sys.modules, 'ctypes', system.ctypes)
    monkeypatch.setitem(sys.modules, 'fcntl', None)  # no flock there: importing fcntl fails
    return system


@pytest.mark.parametrize(
    ('exclusive', 'blocking', 'flags'),
    [
        (False, True, 0),
        (True, True, LOCKFILE_EXCLUSIVE_LOCK),
        (False, False, LOCKFILE_FAIL_IMMEDIATELY),
        (True, False, LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY),
    ],
)
def test_windows_lock_flags(windows: FakeWindows, exclusive: bool, blocking: bool, flags: int) -> None:
    files.lock_fd(5, exclusive=exclusive, blocking=blocking)
    assert windows.handles == [5]
    assert windows.locks == [{'handle': 1005, 'flags': flags, 'reserved': 0, 'low': 0xFFFFFFFF, 'high': 0xFFFFFFFF}]


def test_windows_lock_held_elsewhere_is_would_block(windows: FakeWindows) -> None:
    windows.error = ERROR_LOCK_VIOLATION
    with pytest.raises(WouldBlock):
        files.lock_fd(5, exclusive=True, blocking=False)


def test_windows_lock_other_failure_is_an_os_error(windows: FakeWindows) -> None:
    windows.error = 6  # ERROR_INVALID_HANDLE
    with pytest.raises(OSError, match='Windows error 6') as raised:
        files.lock_fd(5, exclusive=False, blocking=True)
    assert not isinstance(raised.value, WouldBlock)
    assert raised.value.errno == 6


def test_windows_run_lock_takes_the_lock_through_lock_file_ex(windows: FakeWindows, tmp_path: Path) -> None:
    path = tmp_path / 'run' / 'lock'
    with files.run_lock(path, exclusive=True, prepare=lambda: path.parent.mkdir()) as generation:
        assert len(generation) == 32
    with files.run_lock(path, exclusive=False) as again:
        assert again == generation
    assert [lock['flags'] for lock in windows.locks] == [LOCKFILE_EXCLUSIVE_LOCK, 0]


def test_windows_run_lock_maps_a_held_lock_to_would_block_and_closes(
    windows: FakeWindows, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / 'lock'
    with files.run_lock(path, exclusive=True):
        pass
    windows.error = ERROR_LOCK_VIOLATION
    monkeypatch.setattr(files, 'running_inline', lambda: True)
    closed: list[int] = []
    real_close = os.close

    def close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(os, 'close', close)
    with pytest.raises(WouldBlock), files.run_lock(path, exclusive=False):
        pass
    assert windows.locks[-1]['flags'] == LOCKFILE_FAIL_IMMEDIATELY
    assert closed == [windows.handles[-1]]


class FakeFcntl:
    LOCK_SH = 1
    LOCK_EX = 2
    LOCK_NB = 4

    def __init__(self, busy: bool = False) -> None:
        self.busy = busy
        self.calls: list[tuple[int, int]] = []

    def flock(self, fd: int, operation: int) -> None:
        self.calls.append((fd, operation))
        if self.busy and operation & self.LOCK_NB:
            raise BlockingIOError(11, 'Resource temporarily unavailable')


@pytest.mark.parametrize(
    ('exclusive', 'blocking', 'operation'),
    [(False, True, 1), (True, True, 2), (False, False, 1 | 4), (True, False, 2 | 4)],
)
def test_posix_lock_operations(
    monkeypatch: pytest.MonkeyPatch, exclusive: bool, blocking: bool, operation: int
) -> None:
    fake = FakeFcntl()
    monkeypatch.setattr(sys, 'platform', 'darwin')
    monkeypatch.setitem(sys.modules, 'fcntl', fake)
    files.lock_fd(3, exclusive=exclusive, blocking=blocking)
    assert fake.calls == [(3, operation)]


def test_posix_lock_held_elsewhere_is_would_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, 'fcntl', FakeFcntl(busy=True))
    monkeypatch.setattr(sys, 'platform', 'linux')
    with pytest.raises(WouldBlock):
        files.lock_fd(3, exclusive=True, blocking=False)


@pytest.mark.skipif(sys.platform == 'win32', reason='flock')
def test_posix_real_flock_conflict_is_would_block(tmp_path: Path) -> None:
    path = tmp_path / 'lock'
    path.write_bytes(b'')
    held = os.open(path, os.O_RDWR)
    other = os.open(path, os.O_RDONLY)
    try:
        files.lock_fd(held, exclusive=True, blocking=True)
        with pytest.raises(WouldBlock):
            files.lock_fd(other, exclusive=False, blocking=False)
        os.close(held)
        held = -1
        files.lock_fd(other, exclusive=False, blocking=False)
    finally:
        os.close(other)
        if held >= 0:
            os.close(held)


def test_pread_without_os_pread_reads_from_the_offset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / 'f'
    path.write_bytes(b'0123456789')
    monkeypatch.delattr(os, 'pread', raising=False)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert files._pread(fd, 4, 3) == b'3456'  # pyright: ignore[reportPrivateUsage]
        assert files._pread(fd, 100, 8) == b'89'  # pyright: ignore[reportPrivateUsage]
    finally:
        os.close(fd)


def test_step_file_imports_without_fcntl(tmp_path: Path) -> None:
    script = (
        'import sys\n'
        "sys.modules['fcntl'] = None  # a system without fcntl: importing it raises ImportError\n"
        'import step_file\n'
        'import step_file.files\n'
        "print('imported', step_file.FileStepStore.__name__)\n"
    )
    done = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == 'imported FileStepStore'
