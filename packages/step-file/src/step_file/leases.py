"""Run leases in a file store: a run folder's lease file and start point, and the store's index of states.

A run's lease is `<run>/lease.json`, one JSON object replaced whole (a temporary file, then a
rename) by every swap: the columns the engine compares (`epoch`, `state`, `host`, and `expires`:
seconds since the Unix epoch on this host's clock) and `body`, the rest of the lease as the engine
encoded it, kept as a string. The start point stored with it is `<run>/lease-start`, the engine's
bytes as given.

`ListLeases` must not read every run, so the store keeps an index of live states: an empty marker
file `<directory>/.leases+/<state>/<run id>` for each run whose lease is in `state` (any state but
`ended`). The lease file is the source of truth. A swap, under the run's exclusive lock, adds the
new state's marker before it writes the lease file and removes the other states' markers after it,
so a live lease has its marker at every moment, even when the process is killed in between. What
a kill can leave is a marker too many: a listing checks each marker against the lease file and
passes over one that does not match, and the run's next swap (or its deletion) removes it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, cast

from stepcore.backend import (
    FORMAT_KEY,
    RECORD_FORMAT_VERSION,
    LeaseState,
    check_format_version,
    create_file,
    fsync_dir,
    make_dir,
    open_binary,
    ops,
    remove_file,
    validate_path_safe_run_id,
)

__all__ = ('LeaseIndex', 'lease_document', 'read_lease')

logger = logging.getLogger('step_file')

_ENDED = LeaseState.ENDED.value
_STATE_NAME = re.compile(r'[a-z_]{1,64}')
"""What a state must look like to name a folder of the index (every `LeaseState` value does)."""


def lease_document(row: ops.LeaseRow) -> bytes:
    """The content of a run's `lease.json` for `row`."""
    body = row.body.decode() if isinstance(row.body, bytes) else row.body
    document = {
        FORMAT_KEY: RECORD_FORMAT_VERSION,
        'run_id': row.run_id,
        'epoch': row.epoch,
        'state': row.state,
        'host': row.host,
        'expires': row.expires,
        'body': body,
    }
    return json.dumps(document, separators=(',', ':'), ensure_ascii=False).encode()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_file(path: Path) -> bytes:
    """The whole of a small file, with a third of `Path.read_bytes`'s cost (every fenced write reads one)."""
    fd = open_binary(path, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b''.join(chunks)
    finally:
        os.close(fd)


def read_lease(run_id: str, path: Path) -> ops.LeaseRow | None:
    """The lease in `path` (`None` when there is no such file).

    An `OSError` when the file cannot be read, a `ValueError` saying what is wrong when its content
    is damaged (the store reports either as a damaged lease).
    """
    try:
        raw = _read_file(path)
    except FileNotFoundError:
        return None
    try:
        document: Any = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f'lease file {str(path)!r} is unparsable ({exc})') from None
    if not isinstance(document, dict):
        raise ValueError(f'lease file {str(path)!r} does not hold a JSON object')
    content = cast(dict[str, Any], document)
    check_format_version(content.get(FORMAT_KEY), what=f'lease file {str(path)!r}')
    epoch, state, host = content.get('epoch'), content.get('state'), content.get('host')
    expires, body = content.get('expires'), content.get('body')
    if (
        not _is_int(epoch)
        or not isinstance(state, str)
        or not isinstance(host, str)
        or not (_is_int(expires) or isinstance(expires, float))
        or not isinstance(body, str)
    ):
        raise ValueError(f'lease file {str(path)!r} lacks a valid epoch, state, host, expires or body')
    if content.get('run_id') != run_id:
        raise ValueError(f'lease file {str(path)!r} holds the lease of run {content.get("run_id")!r}')
    return ops.LeaseRow(run_id, cast(int, epoch), state, host, float(cast(float, expires)), body)


class LeaseIndex:
    """The marker files `<root>/<state>/<run id>` of the runs whose lease is in a live state.

    Marked and unmarked only under the run's exclusive lock, in the order the module docstring
    gives; listed without a lock (a reader checks each marker against the run's lease file).
    """

    def __init__(self, root: Path, *, sync: bool) -> None:
        self.root = root
        self._sync = sync

    def mark(self, run_id: str, state: str) -> None:
        """Mark the run as in `state` (nothing for `ended`, which is never listed)."""
        if state == _ENDED:
            return
        if not _STATE_NAME.fullmatch(state):
            raise ValueError(f'lease state {state!r} cannot name a folder of the index {str(self.root)!r}')
        path = self.root / state / run_id
        try:
            fd = create_file(path, os.O_WRONLY)
        except FileExistsError:
            return  # marked already (a renewal)
        except FileNotFoundError:
            make_dir(path.parent)  # the first lease in this state: the folder is fsynced into its parent
            try:
                fd = create_file(path, os.O_WRONLY)
            except FileExistsError:
                return
        os.close(fd)
        if self._sync:
            fsync_dir(path.parent)

    def unmark(self, run_id: str, *, keep: str | None = None) -> None:
        """Remove the run's marker from every state but `keep` (markers a kill left included).

        A marker that cannot be removed is left with a warning: it is one too many, which a listing
        passes over, and the write it follows is already made.
        """
        try:
            states = os.listdir(self.root)
        except FileNotFoundError:
            return
        for state in states:
            if state == keep:
                continue
            path = self.root / state / run_id
            try:
                remove_file(path)
            except (FileNotFoundError, NotADirectoryError):
                pass
            except OSError as exc:
                logger.warning('step_file: cannot remove the lease marker %s (%s); it is ignored', path, exc.strerror)

    def listed(self, state: str) -> list[str]:
        """The run ids marked as in `state` (a marker may be stale: check it against the lease file)."""
        if not _STATE_NAME.fullmatch(state):
            return []
        try:
            names = os.listdir(self.root / state)
        except (FileNotFoundError, NotADirectoryError):
            return []
        found: list[str] = []
        for name in names:
            with contextlib.suppress(ValueError):
                found.append(validate_path_safe_run_id(name))
        return found
