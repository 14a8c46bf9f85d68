"""`FileStepStore`: one folder per run, append-only logs and incremental snapshots.

The store is the stepcore engine over `FilePort`, which answers the engine's operations with the
files of a run folder, on the store's own worker thread. The folder's files and formats are in
`layout.py`, its append-only logs in `files.py` (what a process keeps of each: `logs.py`,
`nodes.py`), its lease and the store's index of lease states in `leases.py`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, Literal, cast

from media_disk import DiskMediaStore
from stepcore.backend import (
    CHECKSUMS,
    DEFAULT_MEDIA_THRESHOLD_BYTES,
    ENCRYPTION,
    HEAD_KEY,
    LEASES,
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
    TEMP_NAME,
    DamagedRecordError,
    Encryption,
    EngineStore,
    Fenced,
    KeyConflict,
    MediaStoreOption,
    SnapshotState,
    SyncPort,
    WorkerThread,
    WouldBlock,
    decoded,
    fsync_dir,
    make_dir,
    ops,
    remove_file,
    replace_file,
    running_inline,
    skip_damaged,
    using_full_fsync,
    validate_path_safe_run_id,
    write_atomic,
    write_temp,
)

from .files import Log, run_lock
from .layout import (
    EFFECTS_FILE,
    EVENTS_FILE,
    LEASE_FILE,
    LEASE_INDEX_DIR,
    LEASE_START_FILE,
    LOCK_FILE,
    MEDIA_DIR,
    MESSAGES_FILE,
    RUN_FILE,
    RUN_FILES,
    SNAPSHOT_KEYS_FILE,
    SNAPSHOT_NAME,
    SNAPSHOTS_DIR,
    STATES,
    STORE_ID_FILE,
    Uncommitted,
    as_bytes,
    holds_records,
    read_run,
    read_snapshot,
    snapshot_document,
    with_field,
)
from .leases import LeaseIndex, lease_document, read_lease
from .logs import EPOCH, EventsSeen, KeysSeen, LedgerSeen, json_object
from .nodes import Nodes, NodeWriter, parse_nodes

__all__ = ('Durability', 'FilePort', 'FileStepStore')

logger = logging.getLogger('step_file')

_MAX_CACHED_RUNS = 1024

Durability = Literal['normal', 'full']
"""How much of each write is forced to disk (see `FileStepStore`)."""
_DURABILITY = ('normal', 'full')


@dataclass(slots=True)
class _Run:
    """One run folder and what this process keeps of its logs."""

    folder: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: bool = False
    swept: bool = False
    """Whether the temporary files of killed writes were removed since this store first locked
    the folder's generation (see `FileStepStore._sweep`)."""
    generation: bytes | None = None
    """The folder's generation (see `files.run_lock`) the logs below were read from."""
    events: Log[EventsSeen] = field(init=False)
    ledger: Log[LedgerSeen] = field(init=False)
    keys: Log[KeysSeen] = field(init=False)
    nodes: Log[NodeWriter] = field(init=False)

    def __post_init__(self) -> None:
        self.forget()

    def locked(self, generation: bytes) -> None:
        """Note the folder's generation once its lock is held; forget the logs of an earlier one."""
        if generation != self.generation:
            if self.generation is not None:
                self.forget()
            self.generation = generation
            self.swept = False

    def forget(self) -> None:
        """Read every log afresh from now on."""
        folder, run_id = self.folder, self.folder.name
        self.events = Log(folder / EVENTS_FILE, EventsSeen)
        self.ledger = Log(folder / EFFECTS_FILE, lambda: LedgerSeen(run_id, folder / EFFECTS_FILE))
        self.keys = Log(folder / SNAPSHOT_KEYS_FILE, lambda: KeysSeen(folder / SNAPSHOT_KEYS_FILE))
        self.nodes = Log(folder / MESSAGES_FILE, lambda: NodeWriter(folder / MESSAGES_FILE))

    def snapshot(self, seq: int) -> Path:
        return self.folder / SNAPSHOTS_DIR / f'{seq}.json'


@dataclass(slots=True)
class _Tx:
    """An open write (`repair`: the runs' exclusive locks are held) or read, with the message nodes read in it."""

    repair: bool
    nodes: dict[str, tuple[Nodes, int]] = field(default_factory=dict[str, tuple[Nodes, int]])


def _key_line(entry: dict[str, object]) -> bytes:
    """One line of `snapshot-keys.jsonl`."""
    return json.dumps(entry, separators=(',', ':'), ensure_ascii=False).encode() + b'\n'


class FilePort(SyncPort):
    """The engine's operations on run folders under `directory` (layout in `FileStepStore`).

    A write holds, for each of its runs, this process's lock of the run and an exclusive `flock`
    on the run's `.lock` file; a read holds a shared `flock`. Logs are only appended to, under the
    exclusive lock, in whole lines. A lease swap is a write too: it and every fenced write of the
    run hold the same exclusive lock, so `CheckLease` (reading the lease file inside the write) is
    atomic against a takeover.
    """

    gapless_events = True  # seqs follow line numbers

    name = 'file store'

    def __init__(self, directory: Path, *, full: bool, full_fsync: bool | None = None) -> None:
        super().__init__(worker=WorkerThread('step-file'))
        self.directory = directory
        self._full = full
        self._full_fsync = full_fsync
        self.inline_writes = not full  # appends without fsync are short enough for the event loop
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._runs_lock = threading.Lock()
        self._leases = LeaseIndex(directory / LEASE_INDEX_DIR, sync=full)

    def describe(self) -> str:
        return f'directory {str(self.directory)!r}'

    def check_run_id(self, run_id: object) -> str:
        checked = validate_path_safe_run_id(run_id)
        if checked == MEDIA_DIR and not _run_files_in(self.directory / MEDIA_DIR):
            raise ValueError(
                f'run_id {checked!r} cannot be used with the file store: {str(self.directory / MEDIA_DIR)!r} is '
                'its media folder, which a run of that id would share; give the run another id'
            )
        return checked

    def _run(self, run_id: str) -> _Run:
        with self._runs_lock:
            run = self._runs.get(run_id)
            if run is None:
                run = self._runs[run_id] = _Run(self.directory / run_id)
                while len(self._runs) > _MAX_CACHED_RUNS:
                    self._runs.popitem(last=False)
            else:
                self._runs.move_to_end(run_id)
            return run

    def _prepare(self, run: _Run) -> None:
        if running_inline():  # creating folders fsyncs their parent: not on the event loop
            raise WouldBlock
        make_dir(self.directory)
        make_dir(run.folder)
        make_dir(run.folder / SNAPSHOTS_DIR)
        run.ready = True

    @contextlib.contextmanager
    def transaction(self, runs: Sequence[str]) -> Iterator[_Tx]:
        inline = running_inline()
        with contextlib.ExitStack() as stack:
            stack.enter_context(using_full_fsync(self._full_fsync))  # how every fsync of the write flushes
            for run_id in sorted(set(runs)):
                run = self._run(run_id)
                if not run.lock.acquire(blocking=not inline):
                    raise WouldBlock
                stack.callback(run.lock.release)
                if not run.ready or not os.path.isdir(run.folder):
                    self._prepare(run)
                run.locked(
                    stack.enter_context(
                        run_lock(run.folder / LOCK_FILE, exclusive=True, prepare=lambda r=run: self._prepare(r))
                    )
                )
                if not run.swept:
                    self._sweep(run)
            yield _Tx(repair=True)

    def _sweep(self, run: _Run) -> None:
        """Remove what writes killed between creating a temporary file and renaming it left in the
        run's folder (a snapshot's or the run record's); the run's exclusive lock is held, so no
        live writer has one open. Once per folder generation, on the store's thread."""
        if running_inline():  # a directory listing per run: not on the event loop
            raise WouldBlock
        for folder in (run.folder, run.folder / SNAPSHOTS_DIR):
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                continue
            for name in filter(TEMP_NAME.fullmatch, names):
                try:
                    os.unlink(folder / name)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    logger.warning('step_file: cannot remove the leftover %s (%s)', folder / name, exc.strerror)
        run.swept = True

    @contextlib.contextmanager
    def reading(self, run_id: str | None) -> Iterator[_Tx]:
        if run_id is None:
            yield _Tx(repair=False)
            return
        run = self._run(run_id)
        with run.lock, run_lock(run.folder / LOCK_FILE, exclusive=False) as generation:
            if generation:  # no lock file (nothing written yet, or deleted): the logs say so themselves
                run.locked(generation)
            yield _Tx(repair=False)

    def close(self) -> None:
        with self._runs_lock:
            self._runs.clear()
        super().close()

    # -- runs ---------------------------------------------------------------------------------

    def insert_run(self, tx: _Tx, op: ops.InsertRun) -> ops.RunRow | None:
        row = op.row
        path = self._run(row.run_id).folder / RUN_FILE
        existing = read_run(row.run_id, path)
        if existing is not None:
            return existing
        tmp = write_temp(path, with_field(row.body, 'run_id', row.run_id))
        try:
            # A hard link never replaces an existing file: of several processes registering the
            # same run id at once, exactly one creates run.json, always complete.
            os.link(tmp, path)
        except FileExistsError:
            return read_run(row.run_id, path)
        finally:
            remove_file(tmp, missing_ok=True)  # on Windows a reader of run.json (the same file) delays it
        fsync_dir(path.parent)
        return None

    def get_run(self, tx: _Tx, op: ops.GetRun) -> ops.RunRow | None:
        return read_run(op.run_id, self.directory / op.run_id / RUN_FILE)

    def list_runs(self, tx: _Tx, op: ops.ListRuns) -> list[ops.RunRow]:
        try:
            names = sorted(e.name for e in os.scandir(self.directory) if e.is_dir() and not e.name.startswith('.'))
        except FileNotFoundError:
            return []
        rows: list[ops.RunRow] = []
        for name in names:
            with contextlib.suppress(ValueError):
                row = read_run(validate_path_safe_run_id(name), self.directory / name / RUN_FILE)
                if row is not None:
                    rows.append(row)
        # Every run record is read anyway (the folders hold no index), so every candidate is answered,
        # filtered and in order, without a limit; a record that did not parse is always answered, so the
        # engine reports it as damaged instead of its columns deciding the filters. The conversation
        # and parent filters are left to the engine, which checks each record first: a damaged field
        # name or value in run.json must not drop the run from a listing without a word.
        readable = [r for r in rows if isinstance(r.body, Mapping) and r.started_at != EPOCH]
        damaged = [r for r in rows if not (isinstance(r.body, Mapping) and r.started_at != EPOCH)]
        return [*damaged, *replace(op, limit=None, conversation_id=None, parent_run_id=None).pick(readable)]

    def list_run_ids(self, tx: _Tx, op: ops.ListRunIds) -> list[str]:
        try:
            entries = [e for e in os.scandir(self.directory) if e.is_dir() and not e.name.startswith('.')]
        except FileNotFoundError:
            return []
        found: list[str] = []
        for entry in entries:
            folder = Path(entry.path)
            try:
                snapshots = os.listdir(folder / SNAPSHOTS_DIR) if (folder / SNAPSHOTS_DIR).is_dir() else []
            except OSError:
                snapshots = []
            if (folder / RUN_FILE).exists() or snapshots:
                with contextlib.suppress(ValueError):
                    found.append(validate_path_safe_run_id(entry.name))
        return found

    def delete_run(self, tx: _Tx, op: ops.DeleteRun) -> bool:
        """Move the run's folder aside under a hidden name (`_set_aside`), then remove it (the run's lock is held).

        The lease and its start point go with the folder; the run's markers in the index of lease
        states are removed after it (a kill in between leaves markers a listing passes over).
        """
        folder = self._run(op.run_id).folder
        existed = holds_records(folder)
        with self._runs_lock:
            self._runs.pop(op.run_id, None)
        if op.run_id == MEDIA_DIR:
            # a run stored under the media folder's name before that was refused: its files only
            _remove_run_files(folder)
        elif folder.exists():
            _set_aside(folder, self.directory / f'.{op.run_id}.deleted.{uuid.uuid4().hex}')
            fsync_dir(self.directory)
        self._leases.unmark(op.run_id)
        # This delete's folder, and any an interrupted delete of the same run id left behind.
        for tombstone in self.directory.glob(f'.{op.run_id}.deleted.*'):
            try:
                shutil.rmtree(tombstone)
            except OSError as exc:
                logger.warning(
                    'step_file: run %r is deleted but %s could not be removed (%s): remove it by hand',
                    op.run_id,
                    tombstone,
                    exc,
                )
        return existed

    # -- the store itself ------------------------------------------------------------------------

    def store_identity(self, tx: _Tx, op: ops.StoreIdentity) -> str:
        """The id in `.store-id+`; when there is none, `op.new_id` written there first. A hard link of a
        finished temporary file never replaces an existing one: of several processes asking at once,
        exactly one creates the file, always complete, and every one reads its id."""
        path = self.directory / STORE_ID_FILE
        found = self._stored_id(path)
        if found is not None:
            return found
        make_dir(self.directory)
        tmp = write_temp(path, f'{op.new_id}\n'.encode())  # written once: always forced to disk
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        else:
            fsync_dir(self.directory)
        finally:
            remove_file(tmp, missing_ok=True)
        found = self._stored_id(path)
        assert found is not None, f'{path} vanished after it was created'
        return found

    def _stored_id(self, path: Path) -> str | None:
        try:
            text = path.read_text(encoding='utf-8', errors='replace').strip()
        except FileNotFoundError:
            return None
        if not text or any(c.isspace() for c in text):
            raise ValueError(
                f'the store id file {str(path)!r} is damaged (it holds {text[:40]!r}): remove it, and the store '
                'takes a new id when next asked'
            )
        return text

    def store_location(self, tx: _Tx, op: ops.StoreLocation) -> str:
        return f'directory {os.path.realpath(self.directory)!r}'

    # -- leases: a swap and every fenced write of a run hold the run's exclusive lock -----------

    def _lease(self, run_id: str) -> ops.LeaseRow | None:
        """The run's lease from its lease file; `DamagedRecordError` when the file cannot be had."""
        path = self.directory / run_id / LEASE_FILE
        return decoded(lambda: read_lease(run_id, path), run_id=run_id, record='lease', where=self.describe())

    def get_lease(self, tx: _Tx, op: ops.GetLease) -> ops.LeaseRead:
        return ops.LeaseRead(self._lease(op.run_id), time.time())

    def swap_lease(self, tx: _Tx, op: ops.SwapLease) -> ops.LeaseSwap:
        """The start point, the new state's marker, the lease file, then the other states' markers
        removed: the lease file is where the swap takes effect (see `leases.py`)."""
        now = time.time()
        current = self._lease(op.run_id)
        if not op.matches(current, now):
            return ops.LeaseSwap(False, ops.LeaseRead(current, now))
        row = op.stored(now)
        folder = self._run(op.run_id).folder  # made by `transaction`, even before the run registers
        if op.start is not None:
            write_atomic(folder / LEASE_START_FILE, op.start, sync=self._full)
            self.boundary('swap_lease:start')
        self._leases.mark(op.run_id, row.state)
        self.boundary('swap_lease:index')
        write_atomic(folder / LEASE_FILE, lease_document(row), sync=self._full)
        self.boundary('swap_lease:lease')
        self._leases.unmark(op.run_id, keep=row.state)
        return ops.LeaseSwap(True, ops.LeaseRead(row, now))

    def list_leases(self, tx: _Tx, op: ops.ListLeases) -> tuple[list[ops.LeaseRow], float]:
        """Through the index: each marked run's lease file, kept when it is in the marker's state."""
        rows: dict[str, ops.LeaseRow] = {}
        for state in dict.fromkeys(op.states):
            for run_id in self._leases.listed(state):
                if run_id in rows:
                    continue  # moved between two of the states while they were listed
                try:
                    row = self._lease(run_id)
                except DamagedRecordError as error:
                    skip_damaged(error)
                    continue
                if row is not None and row.state == state:  # else a marker a kill left behind
                    rows[run_id] = row
        return list(rows.values()), time.time()

    def get_lease_start(self, tx: _Tx, op: ops.GetLeaseStart) -> bytes | None:
        folder = self.directory / op.run_id
        if not (folder / LEASE_FILE).exists():
            return None  # a start point without its lease: a swap killed before it took effect

        def read() -> bytes | None:
            try:
                return (folder / LEASE_START_FILE).read_bytes()
            except FileNotFoundError:
                return None

        return decoded(read, run_id=op.run_id, record='start point', where=self.describe())

    def check_lease(self, tx: _Tx, op: ops.CheckLease) -> None:
        current = self._lease(op.run_id)
        if current is None or current.epoch != op.epoch:
            raise Fenced(op.run_id)

    # -- events and ledger --------------------------------------------------------------------

    def put_events(self, tx: _Tx, op: ops.PutEvents) -> None:
        log = self._run(op.run_id).events
        with log.writing() as fd:
            seen = log.seen
            seq = seen.next_seq
            added: set[str] = set()
            lines: list[bytes] = []
            for row in op.rows:
                key = row.idempotency_key
                if key is not None:
                    if key in seen.keys or key in added:
                        continue
                    added.add(key)
                lines.append(with_field(row.body, 'seq', seq) + b'\n')
                seq += 1
            if lines:
                log.append(fd, b''.join(lines), sync=self._full)

    def list_events(self, tx: _Tx, op: ops.ListEvents) -> list[ops.EventRow]:
        rows: list[ops.EventRow] = []
        lines = self._run(op.run_id).events.lines()
        first = 1
        if op.newest and op.limit is not None and len(lines) > op.limit:
            # seqs follow line numbers: the newest `limit` events are the last lines (the run's count
            # asks for the newest one at every lease renewal: never a parse of the whole log)
            first = len(lines) - op.limit + 1
            lines = lines[-op.limit :]
        for number, line in enumerate(lines, first):
            data = json_object(line)
            seq = data.get('seq') if data is not None else None
            if data is None or not isinstance(seq, int):
                rows.append(ops.EventRow(op.run_id, None, line, seq=number))  # the engine names and skips it
                continue
            key = data.get('idempotency_key')
            rows.append(ops.EventRow(op.run_id, key if isinstance(key, str) else None, data, seq=seq))
        return rows

    def put_effects(self, tx: _Tx, op: ops.PutEffects) -> None:
        by_run: dict[str, list[bytes]] = {}
        for row in op.rows:
            by_run.setdefault(row.run_id, []).append(as_bytes(row.body) + b'\n')
        for run_id, lines in by_run.items():
            log = self._run(run_id).ledger
            with log.writing() as fd:
                log.append(fd, b''.join(lines), sync=self._full)

    def list_effects(self, tx: _Tx, op: ops.ListEffects) -> list[ops.EffectRow]:
        # An unreadable entry (status '') goes with every answer: the engine refuses to read the ledger.
        # A call's superseded lines go before its latest one, to be checked (see `LedgerSeen.earlier`).
        return self._run(op.run_id).ledger.refresh(repair=tx.repair).rows(op.tool_call_id)

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot_key_applied(self, tx: _Tx, op: ops.SnapshotKeyApplied) -> bool:
        run = self._run(op.run_id)
        if op.key in run.keys.refresh(repair=tx.repair).keys:
            return True
        return tx.repair and op.key in self._record_unrecorded(run)

    def _record_unrecorded(self, run: _Run) -> set[str]:
        """Append the key lines of snapshot files that have none (a save stopped between its file and
        its key line), so retention knows them and a replayed save is suppressed; their keys.

        Only files past the last key line can lack one: usually a single `stat` finds there are none.
        """
        found: set[str] = set()
        with run.keys.writing() as keys_fd:
            seq = run.keys.seen.next_seq
            while os.path.exists(run.snapshot(seq)):
                try:
                    _, _, header = read_snapshot(run.snapshot(seq))
                except (OSError, ValueError):  # gone, unreadable, never committed or damaged: no key to keep
                    header = {}
                key = header.get('idempotency_key')
                state = header.get('state')
                line = {'seq': seq, 'state': state if state in STATES else None, 'key': key}
                run.keys.append(keys_fd, _key_line(line), sync=self._full)
                if isinstance(key, str):
                    found.add(key)
                seq += 1
        return found

    def node_exists(self, tx: _Tx, op: ops.NodeExists) -> bool:
        return self._run(op.run_id).nodes.refresh(repair=tx.repair).holds(op.node)

    def snapshot_states(self, tx: _Tx, op: ops.SnapshotStates) -> list[tuple[int, str]]:
        return list(self._run(op.run_id).keys.refresh(repair=tx.repair).states.items())

    def put_snapshot(self, tx: _Tx, op: ops.PutSnapshot) -> list[int]:
        """The new message nodes, then the snapshot file (atomically), then the snapshot's key line."""
        run = self._run(op.run_id)
        with run.keys.writing() as keys_fd:
            keys = run.keys.seen
            if op.key is not None and op.key in keys.keys:
                raise KeyConflict(op.key)
            with run.nodes.writing() as nodes_fd:
                writer = run.nodes.seen
                data, ids, written = writer.encode(op.parent, op.bodies)
                if ids:
                    run.nodes.append(nodes_fd, data, sync=self._full)
                    writer.commit(written)
            self.boundary('put_snapshot:nodes')
            seq = keys.next_seq
            while os.path.exists(run.snapshot(seq)):  # left by a save that crashed before its key line
                seq += 1
            document = snapshot_document(ids[-1] if ids else op.parent, op.row.length, op.row.body, seq)
            write_atomic(run.snapshot(seq), document, sync=self._full)
            self.boundary('put_snapshot:file')
            line = {'seq': seq, 'state': op.row.state, 'key': op.key}
            run.keys.append(keys_fd, _key_line(line), sync=self._full)
        return ids

    def delete_snapshots(self, tx: _Tx, op: ops.DeleteSnapshots) -> None:
        """Unlink the pruned snapshot files; one that cannot be unlinked (a directory in its place, say)
        is left with a warning: the save that prunes it is already written, and must not fail now."""
        run = self._run(op.run_id)
        for seq in op.seqs:
            path = run.snapshot(seq)
            try:
                remove_file(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning(
                    'step_file: snapshot %s is pruned but cannot be removed (%s: %s): it is unreadable; '
                    'remove it by hand',
                    path,
                    type(exc).__name__,
                    exc.strerror,
                )
            run.keys.seen.states.pop(seq, None)

    def list_snapshots(self, tx: _Tx, op: ops.ListSnapshots) -> list[ops.SnapshotRow]:
        run = self._run(op.run_id)
        try:
            names = os.listdir(run.folder / SNAPSHOTS_DIR)
        except FileNotFoundError:
            return []
        seqs = sorted(int(m.group(1)) for m in map(SNAPSHOT_NAME.fullmatch, names) if m is not None)
        rows: list[ops.SnapshotRow] = []
        for seq in reversed(seqs) if op.newest else seqs:
            row = self._snapshot_row(tx, run, seq, complete_only=op.complete_only)
            if row is None:
                continue
            rows.append(row)
            if op.newest:
                break
        return rows

    def _snapshot_row(self, tx: _Tx, run: _Run, seq: int, *, complete_only: bool) -> ops.SnapshotRow | None:
        """Snapshot `seq`'s row; `None` when it is gone, was never committed (logged) or is not
        complete while `complete_only`.

        A file that cannot be read, or whose content is damaged, gives a row with state `''`
        (unknown, so it is never filtered out) whose body the engine reports as unreadable or
        unparsable.
        """
        run_id, path = run.folder.name, run.snapshot(seq)
        try:
            head, length, header = read_snapshot(path)
        except FileNotFoundError:
            return None  # pruned meanwhile
        except OSError as exc:
            reason = f'snapshot file {str(path)!r} is unreadable ({type(exc).__name__}: {exc.strerror})'
            return ops.SnapshotRow(run_id, '', None, 0, ops.Unreadable(reason), seq=seq)
        except Uncommitted as exc:
            logger.warning('step_file: passing over snapshot %s: %s', path, exc)
            return None
        except ValueError as exc:
            return ops.SnapshotRow(run_id, '', None, 0, ops.Unparsable(str(exc)), seq=seq)
        state = header.get('state')
        state = cast(str, state) if state in STATES else ''  # unknown: the engine reports it when read
        if complete_only and state not in (SnapshotState.COMPLETE.value, ''):
            return None
        if head is not None and length:
            end = self._nodes(tx, run)[1]
            if head >= end:
                if self._holds_message(run, header.get(HEAD_KEY)):
                    # the message it names did reach the file, under another id: not a crash
                    reason = (
                        f'snapshot file {str(path)!r} names node {head} as its newest message, past the end of '
                        f'{MESSAGES_FILE} ({end}), which holds that message under another id: the snapshot '
                        'file is damaged'
                    )
                    return ops.SnapshotRow(run_id, '', None, 0, ops.Unparsable(reason), seq=seq)
                logger.warning(
                    'step_file: passing over snapshot %s: its messages are missing from %s (node %d, past its end '
                    'at %d): they never reached the disk (an operating-system crash)',
                    path,
                    MESSAGES_FILE,
                    head,
                    end,
                )
                return None
        return ops.SnapshotRow(run_id, state, head, length, header, seq=seq)

    @staticmethod
    def _holds_message(run: _Run, head_sum: object) -> bool:
        """Whether the run's message file holds a message sealed with `head_sum` (a snapshot header's
        sum of its newest message; `False` when the header holds none, as an encrypted one)."""
        if not isinstance(head_sum, str) or not head_sum.isalnum():
            return False
        mark = b'"_s":"' + head_sum.encode() + b':'
        return any(mark in line for line in run.nodes.lines())

    def _nodes(self, tx: _Tx, run: _Run) -> tuple[Nodes, int]:
        """The run's message nodes and their end, read once per read."""
        found = tx.nodes.get(run.folder.name)
        if found is None:
            found = tx.nodes[run.folder.name] = parse_nodes(run.nodes.lines(), run.nodes.path)
        return found

    def get_nodes(self, tx: _Tx, op: ops.GetNodes) -> Nodes:
        return self._nodes(tx, self._run(op.run_id))[0]


class FileStepStore(EngineStore):
    """Stores each run in its own folder under `directory`.

    Layout of `<directory>/<run_id>/`:

    - `run.json`: the `RunRecord`, created atomically once.
    - `events.jsonl`: step events, one per line, append-only.
    - `tool_effects.jsonl`: tool-effect records, append-only; the last line per `tool_call_id` wins.
    - `messages.jsonl`: the run's messages, each stored once as a node `{"id", "parent", "body"}`.
    - `snapshots/<seq>.json`: one small file per snapshot: its header, head node and length.
    - `snapshot-keys.jsonl`: one line per saved snapshot (seq, state, idempotency key); kept when
      snapshots are pruned, so a replayed save stays suppressed.
    - `lease.json`, `lease-start`: the run's lease (owner, expiry on this host's clock, epoch) and the
      start point stored with it; with `<directory>/.leases+/<state>/<run_id>`, an index of the runs
      whose lease is in each live state (see `leases.py`).

    The store's id (`store_identity()`) is in `<directory>/.store-id+`, written on first ask.

    Saving a step appends only the messages that are new since the previous save (see
    `stepcore.engine`), so bytes grow linearly with the run. Payloads of `media_threshold_bytes` or
    more (`BinaryContent` data and strings) go to `media_store`: with `'auto'` (the default) a
    `DiskMediaStore` in `<directory>/media`; pass `media_store=None` to keep them inline, or a
    media store of your own.

    Several processes may share one directory: every write to a run happens under an exclusive
    `flock` on its `.lock` file, and registration creates `run.json` with an atomic hard link. A
    save writes its new messages, then its snapshot file, then its key line; its ledger entries and
    events follow. An incomplete last line left in a log by a crash is ignored when reading and cut
    off before the next append. Files are `0600` and folders `0700`.

    Leases (feature `leases`) are kept on one host: `expires` is on this host's clock
    (`time.time()`), and a swap holds the run's exclusive lock, as every fenced write does, so a
    write checks the lease and makes its changes with no takeover in between.

    `durability='full'` also fsyncs every append and snapshot file (and its folder). On macOS every
    fsync is an `F_FULLFSYNC`, which also empties the drive's cache; `full_fsync=False` takes the
    plain `fsync` there instead (faster, but the last writes may be lost in a power loss), and the
    default media store follows it. `None` is the platform's default; elsewhere it changes nothing.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT, ENCRYPTION, CHECKSUMS, LEASES}
    )

    def __init__(
        self,
        directory: str | os.PathLike[str],
        media_store: MediaStoreOption = 'auto',
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
        *,
        durability: Durability = 'normal',
        encryption: Encryption | None = None,
        full_fsync: bool | None = None,
    ) -> None:
        if durability not in _DURABILITY:
            raise ValueError(f'durability={durability!r} is not a durability level: use one of {_DURABILITY}')
        if full_fsync is not None and not isinstance(cast(object, full_fsync), bool):
            raise ValueError(f'full_fsync={full_fsync!r} must be True, False or None (the platform default)')
        self.durability: Durability = durability
        self.full_fsync = full_fsync
        self.directory = Path(directory)
        self.media_threshold_bytes = media_threshold_bytes
        super().__init__(
            FilePort(self.directory, full=durability == 'full', full_fsync=full_fsync),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            default_media_store=lambda: DiskMediaStore(self.directory / MEDIA_DIR, full_fsync=full_fsync),
            media_threshold_bytes=media_threshold_bytes,
            encryption=encryption,
        )


def _run_files_in(folder: Path) -> bool:
    """Whether `folder` holds a run's files (not only media blobs)."""
    return any((folder / name).exists() for name in RUN_FILES) or (folder / SNAPSHOTS_DIR).is_dir()


def _set_aside(folder: Path, tombstone: Path) -> None:
    """Take a run's folder out of the store under the hidden name `tombstone`; the run's lock is held.

    Where a folder can be renamed while a file in it is open, it is renamed whole: one step, which a
    kill cannot cut in two. Windows refuses to rename a folder while any file in it is open, and this
    delete holds the run's `.lock` open (as may other processes waiting for it); there the run's
    files move into `tombstone` one by one, the lease first, the run's record last. A kill partway
    leaves the run listed, with what was not yet moved (its reads may then report records missing),
    and deleting it again finishes the job; the folder stays behind with its lock file only, which
    no listing shows.
    """
    if sys.platform != 'win32':
        replace_file(folder, tombstone)
        return
    make_dir(tombstone)
    firsts = (LEASE_FILE, LEASE_START_FILE)
    rest = [name for name in RUN_FILES if name not in (*firsts, RUN_FILE)]
    for name in (*firsts, *rest, SNAPSHOTS_DIR, RUN_FILE):
        with contextlib.suppress(FileNotFoundError):
            replace_file(folder / name, tombstone / name)


def _remove_run_files(folder: Path) -> None:
    """Remove a run's files from a folder it shares with other files, leaving those."""
    for name in RUN_FILES:
        remove_file(folder / name, missing_ok=True)
    shutil.rmtree(folder / SNAPSHOTS_DIR, ignore_errors=True)
    if folder.exists():
        fsync_dir(folder)
