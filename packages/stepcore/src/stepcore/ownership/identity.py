"""Who this process is, as a lease owner, and whether the owner of a lease is still there.

An owner is a host name, a process id, the host's boot id (Linux) and a random token per claim. On
the owner's own host stepcore sees a dead owner at once, without waiting for its lease to expire:
its process is gone, or the host booted since. A process id the system gave to another program
since counts as alive (the safe mistake); so does a process that is not ours to signal. Elsewhere
only the lease's expiry on the store's clock tells.
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
import uuid
from functools import cache
from pathlib import PureWindowsPath

from stepcore.store.leases import Lease, LeaseState, Owner

__all__ = ('boot_id', 'host_name', 'new_owner', 'owner_gone', 'process_alive', 'same_process')


@cache
def host_name() -> str:
    """This host's name, as leases record it."""
    return socket.gethostname() or 'localhost'


@cache
def boot_id() -> str | None:
    """This host's boot id (Linux), `None` where the system has none."""
    try:
        with open('/proc/sys/kernel/random/boot_id', encoding='ascii') as f:
            return f.read().strip() or None
    except OSError:
        return None


def new_owner(role: str = 'run') -> Owner:
    """This process as the owner of a new lease (a fresh token each time): running the run, or
    (`role='recovery'`) holding it to resolve and resume it."""
    return Owner(host=host_name(), pid=os.getpid(), token=uuid.uuid4().hex, boot=boot_id(), role=role)


def same_process(owner: Owner | None) -> bool:
    """Whether `owner` is this very process."""
    return owner is not None and owner.host == host_name() and owner.pid == os.getpid() and owner.boot == boot_id()


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (no signal is delivered).

    A process that has exited but was not reaped by its parent yet (a zombie, on Linux) is gone.
    """
    if pid <= 0:
        return False
    if sys.platform == 'win32':
        return _windows_process_alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # e.g. it exists but belongs to another user: it is alive
    return not _exited(pid)


def _exited(pid: int) -> bool:
    """Whether Linux reports the process as exited and not yet reaped (state `Z` or `X`)."""
    try:
        with open(f'/proc/{pid}/stat', encoding='ascii', errors='replace') as f:
            stat = f.read()
    except OSError:
        return False
    state = stat.rpartition(')')[2].split()
    return bool(state) and state[0] in ('Z', 'X')


_TASKLIST_TIMEOUT = 10
"""Seconds `tasklist` may take to answer before the probe counts the process as alive."""


def _windows_process_alive(pid: int) -> bool:
    """`process_alive` on Windows: whether Windows' own `tasklist` lists a process with this id.

    `os.kill(pid, 0)` would terminate the process there, so it is never called. `tasklist` is run
    from `%SystemRoot%\\System32` by its full path, never looked up on `PATH`, and only when
    `SystemRoot` is an absolute path: a relative or drive-relative one (`''`, `'.'`, `'C:Windows'`,
    `'\\Windows'`) would pick the program by the current folder, so it is refused with a
    `ValueError` naming it. The process is there when a row of the CSV listing has its id in the PID
    column (another process sharing its digits does not count). A listing that cannot be had (the
    program fails, or takes longer than 10 s) counts as alive: the safe mistake.
    """
    raw = os.environ.get('SystemRoot', '')  # noqa: SIM112 - Windows' own spelling, which the tests set elsewhere
    root = PureWindowsPath(raw)
    if not root.is_absolute():
        raise ValueError(
            f'SystemRoot={raw!r} is not an absolute Windows path, so stepcore will not start tasklist from it '
            'to see whether a process runs: set SystemRoot to the Windows folder (such as C:\\Windows)'
        )
    command = [str(root / 'System32' / 'tasklist.exe'), '/FI', f'PID eq {pid}', '/FO', 'CSV', '/NH']
    try:
        listing = subprocess.run(command, capture_output=True, text=True, check=True, timeout=_TASKLIST_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return True
    return any(len(row) > 1 and row[1] == str(pid) for row in csv.reader(listing.stdout.splitlines()))


def owner_gone(lease: Lease) -> bool:
    """Whether the owner of a running lease is provably gone: no owner, or one on this host whose
    process has exited or which ran before the host last booted. Another host's owner is never
    provably gone: its lease's expiry decides."""
    owner = lease.owner
    if lease.state is not LeaseState.RUNNING or owner is None:
        return True
    if owner.host != host_name():
        return False
    mine = boot_id()
    if owner.boot is not None and mine is not None and owner.boot != mine:
        return True
    return not process_alive(owner.pid)
