"""Who this process is, as a lease owner, and whether the owner of a lease is still there.

An owner is a host name, a process id, the host's boot id (Linux) and a random token per claim. On
the owner's own host stepcore sees a dead owner at once, without waiting for its lease to expire:
its process is gone, or the host booted since. A process id the system gave to another program
since counts as alive (the safe mistake); so does a process that is not ours to signal. Elsewhere
only the lease's expiry on the store's clock tells.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from functools import cache
from typing import Any

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


_QUERY_LIMITED_INFORMATION = 0x1000
_ACCESS_DENIED = 5
_STILL_ACTIVE = 259


def _windows_process_alive(pid: int) -> bool:
    """`process_alive` on Windows: whether `OpenProcess` finds the process and it has no exit code yet.

    `os.kill(pid, 0)` would terminate the process there, so it is never called; nor is any program
    (such as `tasklist`) started, so no `PATH` or `SystemRoot` decides what runs. A process this
    user may not open (access denied), or whose exit code cannot be read, counts as alive; a
    process that exited with the code 259 (`STILL_ACTIVE`) too, the safe mistake. The error of a
    failed `OpenProcess` is the one ctypes saved right after the call (`use_last_error`): a
    separate `GetLastError` call could read one set by something in between.
    """
    import ctypes

    windows: Any = ctypes  # `WinDLL` and `get_last_error` exist on Windows only
    kernel32 = windows.WinDLL('kernel32', use_last_error=True)
    open_process = kernel32.OpenProcess
    open_process.restype = ctypes.c_void_p  # a HANDLE: pointer-sized, not the default C int
    open_process.argtypes = (ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32)
    handle = open_process(_QUERY_LIMITED_INFORMATION, False, pid)
    if not handle:
        return bool(windows.get_last_error() == _ACCESS_DENIED)
    try:
        code = ctypes.c_ulong()
        if not kernel32.GetExitCodeProcess(ctypes.c_void_p(handle), ctypes.byref(code)):
            return True
        return code.value == _STILL_ACTIVE
    finally:
        kernel32.CloseHandle(ctypes.c_void_p(handle))


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
