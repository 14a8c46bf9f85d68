"""Blocking I/O that stores built on local resources share: crash-safe file writes, the store's own
worker thread, and a setup run once on first use. Nothing here knows the engine: the engine and the
backends build on it (backends take it from `stepcore.backend`).

- `files.py`: atomic replaces, fsyncs (macOS's `F_FULLFSYNC`, none for Windows' folders), owner-only
  modes, and Windows' waits for another process's handle to close.
- `worker.py`: `WorkerThread`, which runs a store's blocking calls off the event loop in order, or
  inline when it is idle (`running_inline`, `WouldBlock`).
- `setup_once.py`: `SetupOnce`, a store's schema or index setup, run once and again after a failure.
"""

from __future__ import annotations

from stepcore.backend_io.files import (
    TEMP_NAME,
    create_file,
    fsync_dir,
    fsync_file,
    make_dir,
    open_binary,
    remove_file,
    replace_file,
    using_full_fsync,
    write_all,
    write_atomic,
    write_temp,
)
from stepcore.backend_io.setup_once import SetupOnce
from stepcore.backend_io.worker import WorkerThread, WouldBlock, running_inline

__all__ = (
    'TEMP_NAME',
    'SetupOnce',
    'WorkerThread',
    'WouldBlock',
    'create_file',
    'fsync_dir',
    'fsync_file',
    'make_dir',
    'open_binary',
    'remove_file',
    'replace_file',
    'running_inline',
    'using_full_fsync',
    'write_all',
    'write_atomic',
    'write_temp',
)
