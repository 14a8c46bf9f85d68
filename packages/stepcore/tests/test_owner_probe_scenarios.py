"""Whether a lease's owner is still there, in the situations the reference library checks for its own
owner probe, on a simulated Windows and on POSIX systems.

On Windows both libraries ask the system's own `tasklist`, started by its full path under an
absolute `SystemRoot` and filtered to the owner's process id: the running owner is alive, an id no
process has (or only other processes near it) is gone, and a relative or drive-relative
`SystemRoot` is refused before anything is started. Here `subprocess.run` answers as `tasklist`
would.
"""

from __future__ import annotations

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
TASKLIST = r'C:\Windows\System32\tasklist.exe'


class Tasklist:
    """`tasklist /FI "PID eq N" /FO CSV /NH` on a simulated Windows on which the processes `running` exist."""

    def __init__(self, running: set[int]) -> None:
        self.running = running
        self.asked: list[int] = []

    def __call__(self, args: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
        assert options == {'capture_output': True, 'text': True, 'check': True, 'timeout': 10}
        program, flag, query, *rest = args
        assert (program, flag, rest) == (TASKLIST, '/FI', ['/FO', 'CSV', '/NH'])
        pid = int(query.removeprefix('PID eq '))
        self.asked.append(pid)
        if pid in self.running:
            listing = f'"python.exe","{pid}","Console","1","12,345 K"\n'
        else:
            listing = 'INFO: No tasks are running which match the specified criteria.\n'
        return subprocess.CompletedProcess(args, 0, stdout=listing)


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Simulate Windows, where `os.kill` must not be called; the fixture sets the processes that run."""
    monkeypatch.setattr(sys, 'platform', 'win32')
    monkeypatch.setenv('SystemRoot', r'C:\Windows')

    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError(f'os.kill{args} would terminate the process on Windows')

    monkeypatch.setattr(os, 'kill', refuse)

    def with_processes(*running: int) -> Tasklist:
        tasklist = Tasklist(set(running))
        monkeypatch.setattr(subprocess, 'run', tasklist)
        return tasklist

    return with_processes


def lease(*, pid: int | None = OWNER_PID, state: LeaseState = LeaseState.RUNNING) -> Lease:
    """A lease of this host, held by process `pid` (none with `None`)."""
    now = datetime.now(UTC)
    owner = None if pid is None else Owner(host=identity.host_name(), pid=pid, token='t', boot=identity.boot_id())
    return Lease(run_id='r', epoch=1, state=state, owner=owner, expires_at=now + timedelta(minutes=1), checked_at=now)


# -- Windows ----------------------------------------------------------------------------------


def test_windows_an_owner_whose_process_runs_is_there(windows: Any) -> None:
    tasklist = windows(OWNER_PID, 4, 600)
    assert identity.process_alive(OWNER_PID)
    assert not identity.owner_gone(lease())
    assert tasklist.asked == [OWNER_PID, OWNER_PID]


def test_windows_an_owner_no_process_answers_for_is_gone(windows: Any) -> None:
    windows()  # no process at all under that id
    assert not identity.process_alive(OWNER_PID)
    assert identity.owner_gone(lease())


def test_windows_other_processes_do_not_stand_for_the_owner(windows: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def others(args: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
        # a listing that ignored the filter: ids sharing the owner's digits, none of them its own
        rows = '"other.exe","456"\n"python.exe","1230","Console","1","2 K"\n"x.exe","12"\n"y.exe"\n'
        return subprocess.CompletedProcess(args, 0, stdout=rows)

    windows()
    monkeypatch.setattr(subprocess, 'run', others)
    assert not identity.process_alive(OWNER_PID)
    assert identity.owner_gone(lease())


@pytest.mark.parametrize('root', ['', '.', 'C:Windows', r'\Windows'])
def test_windows_a_relative_system_root_is_refused_before_anything_runs(
    windows: Any, monkeypatch: pytest.MonkeyPatch, root: str
) -> None:
    monkeypatch.setenv('SystemRoot', root)
    tasklist = windows(OWNER_PID)
    with pytest.raises(ValueError, match='absolute Windows path') as refused:
        identity.process_alive(OWNER_PID)
    assert f'SystemRoot={root!r}' in str(refused.value)
    assert tasklist.asked == []


def test_windows_without_a_system_root_nothing_runs(windows: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv('SystemRoot')
    tasklist = windows(OWNER_PID)
    with pytest.raises(ValueError, match="SystemRoot='' is not an absolute Windows path"):
        identity.process_alive(OWNER_PID)
    assert tasklist.asked == []


@pytest.mark.parametrize(
    'failure',
    [
        subprocess.CalledProcessError(1, 'tasklist'),
        subprocess.TimeoutExpired('tasklist', 10),
        FileNotFoundError(2, 'The system cannot find the file specified'),
    ],
)
def test_windows_an_owner_the_probe_cannot_ask_about_is_there(
    windows: Any, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    def fails(args: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
        raise failure

    windows()
    monkeypatch.setattr(subprocess, 'run', fails)
    assert identity.process_alive(OWNER_PID)  # the safe mistake: its lease's expiry decides
    assert not identity.owner_gone(lease())


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
