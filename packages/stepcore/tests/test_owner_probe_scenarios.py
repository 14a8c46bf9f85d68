"""Whether a lease's owner is still there, in the situations the reference library checks for its own
owner probe, on a simulated Windows and on POSIX systems.

The reference asks Windows' `tasklist` about the owner's process id and refuses to start it from a
`SystemRoot` that is not an absolute path. stepcore asks the kernel directly (`OpenProcess`,
`GetExitCodeProcess`), so the same questions are answered without any program being started: the
running owner is alive, an id no process has (or that only other processes near it have) is gone,
and a relative or drive-relative `SystemRoot` cannot make it run anything from the wrong folder.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stepcore.ownership import identity
from stepcore.store.leases import Lease, LeaseState, Owner

OWNER_PID = 123
ERROR_INVALID_PARAMETER = 87
"""What `OpenProcess` fails with for an id no process has."""
STILL_ACTIVE = 259


class Kernel32:
    """The kernel32 calls of a simulated Windows on which the processes `running` exist."""

    def __init__(self, running: set[int]) -> None:
        self.running = running
        self.error = 0
        self.asked: list[int] = []
        self.OpenProcess = _Foreign(self._open)
        self.GetExitCodeProcess = _Foreign(self._exit_code)
        self.CloseHandle = _Foreign(self._close)

    def _open(self, access: int, inherit: bool, pid: int) -> int:
        self.asked.append(pid)
        if pid in self.running:
            return 1000 + pid
        self.error = ERROR_INVALID_PARAMETER
        return 0

    def _close(self, handle: Any) -> int:
        return 1

    def _exit_code(self, handle: Any, code: Any) -> int:
        assert handle.value - 1000 in self.running
        code._obj.value = STILL_ACTIVE
        return 1


class _Foreign:
    def __init__(self, body: Any) -> None:
        self.body = body
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self.body(*args)


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Simulate Windows, where no program may be started and `os.kill` must not be called."""
    monkeypatch.setattr(sys, 'platform', 'win32')
    monkeypatch.setenv('SystemRoot', r'C:\Windows')

    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError(f'the owner probe started a program: {args}')

    monkeypatch.setattr(subprocess, 'Popen', refuse)
    monkeypatch.setattr(subprocess, 'run', refuse)
    monkeypatch.setattr(os, 'kill', refuse)

    def with_processes(*running: int) -> Kernel32:
        kernel32 = Kernel32(set(running))

        def load(name: str, use_last_error: bool = False) -> Kernel32:
            return kernel32

        monkeypatch.setattr(ctypes, 'WinDLL', load, raising=False)
        monkeypatch.setattr(ctypes, 'get_last_error', lambda: kernel32.error, raising=False)
        return kernel32

    return with_processes


def lease(*, pid: int | None = OWNER_PID, state: LeaseState = LeaseState.RUNNING) -> Lease:
    """A lease of this host, held by process `pid` (none with `None`)."""
    now = datetime.now(UTC)
    owner = None if pid is None else Owner(host=identity.host_name(), pid=pid, token='t', boot=identity.boot_id())
    return Lease(run_id='r', epoch=1, state=state, owner=owner, expires_at=now + timedelta(minutes=1), checked_at=now)


# -- Windows ----------------------------------------------------------------------------------


def test_windows_an_owner_whose_process_runs_is_there(windows: Any) -> None:
    kernel32 = windows(OWNER_PID, 4, 600)
    assert identity.process_alive(OWNER_PID)
    assert not identity.owner_gone(lease())
    assert kernel32.asked == [OWNER_PID, OWNER_PID]


def test_windows_an_owner_no_process_answers_for_is_gone(windows: Any) -> None:
    windows()  # no process at all under that id
    assert not identity.process_alive(OWNER_PID)
    assert identity.owner_gone(lease())


def test_windows_other_processes_do_not_stand_for_the_owner(windows: Any) -> None:
    kernel32 = windows(456, 1230, 12)  # other ids, some sharing its digits
    assert not identity.process_alive(OWNER_PID)
    assert identity.owner_gone(lease())
    assert set(kernel32.asked) == {OWNER_PID}  # only the owner's own id is asked about


@pytest.mark.parametrize('root', ['', '.', 'C:Windows', r'\Windows'])
def test_windows_a_relative_system_root_cannot_make_the_probe_run_a_program(
    windows: Any, monkeypatch: pytest.MonkeyPatch, root: str
) -> None:
    monkeypatch.setenv('SystemRoot', root)
    windows(OWNER_PID)
    assert identity.process_alive(OWNER_PID)  # answered by the kernel: nothing is started from `root`
    windows()
    assert not identity.process_alive(OWNER_PID)


# -- POSIX ------------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == 'win32', reason='signal 0 would terminate the process on Windows')
def test_posix_a_running_owner_is_there_and_a_lease_not_running_is_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = lease(pid=os.getpid())
    assert not identity.owner_gone(mine)  # this very process
    assert identity.owner_gone(replace(mine, state=LeaseState.ENDED))
    assert identity.owner_gone(lease(pid=None))

    def gone(pid: int, signal: int) -> None:
        raise ProcessLookupError(3, 'No such process')

    monkeypatch.setattr(os, 'kill', gone)
    assert identity.owner_gone(mine)

    def not_ours(pid: int, signal: int) -> None:
        raise PermissionError(1, 'Operation not permitted')  # another user's process: it exists

    monkeypatch.setattr(os, 'kill', not_ours)
    assert not identity.owner_gone(mine)
