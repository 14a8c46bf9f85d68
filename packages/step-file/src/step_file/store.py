"""`FileStepStore`: one folder per run, append-only logs and incremental snapshots."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

from media_disk import DiskMediaStore
from stepcore.codec import (
    FORMAT_KEY,
    check_format_version,
    dump_record,
    dump_record_compact,
    dump_record_json,
    load_record,
)
from stepcore.features import MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION
from stepcore.fileio import fsync_dir, make_dir, write_atomic, write_temp
from stepcore.history import HistoryDelta, HistoryIndex, walk_chain
from stepcore.ids import validate_path_safe_run_id
from stepcore.media import MediaStore
from stepcore.models import (
    RECORD_FORMAT_VERSION,
    ContinuableSnapshot,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.protocols import StepStore, StepWrite
from stepcore.registration import check_registration
from stepcore.retention import check_max_snapshots, snapshots_to_prune
from stepcore.walker import DEFAULT_MEDIA_THRESHOLD_BYTES, MediaWalker
from stepcore.worker import WorkerThread
from stepcore.writes import check_writes

from .files import (
    JsonlCursor,
    append_lines,
    catch_up,
    opened_log,
    read_complete_lines,
    run_lock,
)
from .nodes import Nodes, NodeWriter, node_id_of, parse_nodes

__all__ = (
    'EFFECTS_FILE',
    'EVENTS_FILE',
    'LOCK_FILE',
    'MEDIA_DIR',
    'MESSAGES_FILE',
    'RUN_FILE',
    'SNAPSHOTS_DIR',
    'SNAPSHOT_KEYS_FILE',
    'Durability',
    'FileStepStore',
)

logger = logging.getLogger('step_file')

RUN_FILE = 'run.json'
EVENTS_FILE = 'events.jsonl'
EFFECTS_FILE = 'tool_effects.jsonl'
SNAPSHOT_KEYS_FILE = 'snapshot-keys.jsonl'
MESSAGES_FILE = 'messages.jsonl'
SNAPSHOTS_DIR = 'snapshots'
LOCK_FILE = '.lock'
MEDIA_DIR = 'media'

_SNAPSHOT_NAME = re.compile(r'(\d+)\.json')
_MAX_CACHED_RUNS = 1024

NodeId = Hashable


Durability = Literal['normal', 'full']
"""How much of each write is forced to disk (see `FileStepStore`)."""
_DURABILITY = ('normal', 'full')


class _DefaultMedia:
    """Marker for "a `DiskMediaStore` in `<directory>/media`"."""


_DEFAULT_MEDIA = _DefaultMedia()


_KEPT_BY_FOLDER = {'run_id'}
"""Fields a run folder's files leave out: the folder's name is the run id; readers put it back."""


def _compact(data: dict[str, Any]) -> dict[str, Any]:
    """A record dict without what loads back unchanged: `None` fields, empty `metadata` and `run_id`.

    The run id is the folder's name; readers put it back.
    """
    return {k: v for k, v in data.items() if v is not None and k != 'run_id' and not (k == 'metadata' and v == {})}


def _line(data: dict[str, Any]) -> bytes:
    """One compact JSON line."""
    return json.dumps(data, separators=(',', ':'), ensure_ascii=False).encode() + b'\n'


def _json_object(line: bytes, path: Path) -> dict[str, Any] | None:
    """A log line parsed as a JSON object, or `None` (logged) when it is damaged."""
    try:
        value: Any = json.loads(line)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        if line.strip():
            logger.warning('step_file: skipping a damaged line in %s: %r', path, line[:200])
        return None
    return cast(dict[str, Any], value)


def _json_objects(lines: Iterable[bytes], path: Path) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """Each undamaged log line with its parsed JSON object (damaged lines are logged and skipped)."""
    for line in lines:
        data = _json_object(line, path)
        if data is not None:
            yield line, data


def _sort_time(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class _Uncommitted(ValueError):
    """A snapshot whose file or messages never fully reached the disk (an interrupted write)."""


class _StaleHistory(Exception):
    """The history index names a node the run's message log does not hold."""


@dataclass(frozen=True, slots=True)
class _Paths:
    """The files of one run folder."""

    run_dir: Path
    lock: Path
    events: Path
    effects: Path
    snapshot_keys: Path
    messages: Path
    snapshots: Path

    @classmethod
    def of(cls, run_dir: Path) -> _Paths:
        return cls(
            run_dir=run_dir,
            lock=run_dir / LOCK_FILE,
            events=run_dir / EVENTS_FILE,
            effects=run_dir / EFFECTS_FILE,
            snapshot_keys=run_dir / SNAPSHOT_KEYS_FILE,
            messages=run_dir / MESSAGES_FILE,
            snapshots=run_dir / SNAPSHOTS_DIR,
        )

    def snapshot(self, seq: int) -> Path:
        return self.snapshots / f'{seq}.json'


@dataclass(slots=True)
class _RunState:
    """What this process knows of one run's logs, kept current by reading only what was appended."""

    paths: _Paths
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: bool = False
    events: JsonlCursor = field(default_factory=JsonlCursor)
    next_event_seq: int = 1
    event_keys: set[str] = field(default_factory=set[str])
    effects: JsonlCursor = field(default_factory=JsonlCursor)
    effect_lines: dict[str, bytes] = field(default_factory=dict[str, bytes])
    snapshot_log: JsonlCursor = field(default_factory=JsonlCursor)
    next_snapshot_seq: int = 1
    snapshot_keys: set[str] = field(default_factory=set[str])
    live_snapshots: dict[int, SnapshotState] = field(default_factory=dict[int, SnapshotState])
    nodes: JsonlCursor = field(default_factory=JsonlCursor)
    next_node: int = 0
    node_writer: NodeWriter = field(default_factory=NodeWriter)


@dataclass(slots=True)
class _StoredSnapshot:
    seq: int
    header: ContinuableSnapshot
    head: int | None
    length: int


class FileStepStore(StepStore):
    """Stores each run in its own folder under `directory`.

    Layout of `<directory>/<run_id>/`:

    - `run.json`: the `RunRecord`, created atomically once.
    - `events.jsonl`: step events, one per line, append-only.
    - `tool_effects.jsonl`: tool-effect records, append-only; the last line per `tool_call_id` wins.
    - `messages.jsonl`: the run's messages, each stored once as a node `{"id", "parent", "body"}`.
    - `snapshots/<seq>.json`: one small file per snapshot: its header, head node and length.
    - `snapshot-keys.jsonl`: one line per saved snapshot (seq, state, idempotency key); kept when
      snapshots are pruned, so a replayed save stays suppressed.

    Saving a step appends only the messages that are new since the previous save (see
    `stepcore.history`), so bytes grow linearly with the run. Bytes (`BinaryContent` and strings of
    `media_threshold_bytes` or more) go to `media_store`, by default a `DiskMediaStore` in
    `<directory>/media`; pass `media_store=None` to keep them inline.

    Several processes may share one directory: appends and seq allocation happen under an
    exclusive `flock` on the run's `.lock` file, and registration creates `run.json` with an
    atomic hard link. An incomplete last line left in a log by a crash is ignored when reading
    and cut off before the next append.
    """

    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT})

    def __init__(
        self,
        directory: str | os.PathLike[str],
        media_store: MediaStore | None | _DefaultMedia = _DEFAULT_MEDIA,
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
        *,
        durability: Durability = 'normal',
    ) -> None:
        if durability not in _DURABILITY:
            raise ValueError(f'durability={durability!r} is not a durability level: use one of {_DURABILITY}')
        self.durability: Durability = durability
        self._full = durability == 'full'
        self.directory = Path(directory)
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        if isinstance(media_store, _DefaultMedia):
            media_store = DiskMediaStore(self.directory / MEDIA_DIR)
        self.media_store: MediaStore | None = media_store
        self.media_threshold_bytes = media_threshold_bytes
        self._history = HistoryIndex(MediaWalker(media_store, media_threshold_bytes))
        self._states: OrderedDict[str, _RunState] = OrderedDict()
        self._states_lock = threading.Lock()
        self._worker = WorkerThread('step-file')
        """Where the store's file I/O runs, off the event loop, one call at a time."""

    def __repr__(self) -> str:
        return f'{type(self).__name__}({str(self.directory)!r})'

    # -- per-run state ----------------------------------------------------------------------

    def _state(self, run_id: str) -> _RunState:
        with self._states_lock:
            state = self._states.get(run_id)
            if state is None:
                state = self._states[run_id] = _RunState(_Paths.of(self._run_dir(run_id)))
                while len(self._states) > _MAX_CACHED_RUNS:
                    self._states.popitem(last=False)
            else:
                self._states.move_to_end(run_id)
            return state

    def _run_dir(self, run_id: str) -> Path:
        return self.directory / run_id

    def _prepare(self, state: _RunState) -> _Paths:
        paths = state.paths
        if not state.ready or not os.path.isdir(paths.run_dir):
            make_dir(self.directory)
            make_dir(paths.run_dir)
            make_dir(paths.snapshots)
            state.ready = True
        return paths

    @contextlib.contextmanager
    def _writing(self, state: _RunState) -> Iterator[_Paths]:
        """The run's files, with this process's state lock and the run's exclusive file lock held."""
        with state.lock:
            paths = self._prepare(state)
            with run_lock(paths.lock, exclusive=True):
                yield paths

    @contextlib.contextmanager
    def _reading(self, state: _RunState) -> Iterator[_Paths]:
        """The run's files, with the state lock and a shared file lock (if the run has one) held."""
        with state.lock, run_lock(state.paths.lock, exclusive=False):
            yield state.paths

    # -- runs -------------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        run_id = validate_path_safe_run_id(record.run_id)
        await self._worker.run(self._register_sync, run_id, record)

    def _register_sync(self, run_id: str, record: RunRecord) -> None:
        state = self._state(run_id)
        with state.lock:
            run_dir = self._prepare(state).run_dir
        path = run_dir / RUN_FILE
        if not check_registration(self._read_run(path), record):
            return
        tmp = write_temp(path, dump_record_json(record).encode())
        try:
            # A hard link never replaces an existing file: of several processes registering the
            # same run id at once, exactly one creates run.json, always complete.
            os.link(tmp, path)
        except FileExistsError:
            check_registration(self._read_run(path), record)  # raises unless it is a retry
            return
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(run_dir)

    @staticmethod
    def _read_run(path: Path) -> RunRecord | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return load_record(RunRecord, raw)
        except ValueError as exc:
            raise ValueError(f'run record {str(path)!r} cannot be read: {exc}') from exc

    async def get_run(self, run_id: str) -> RunRecord | None:
        run_id = validate_path_safe_run_id(run_id)
        return await self._worker.run(self._read_run, self._run_dir(run_id) / RUN_FILE)

    async def list_runs(
        self, *, conversation_id: str | None = None, parent_run_id: str | None = None
    ) -> list[RunRecord]:
        return await self._worker.run(self._list_runs_sync, conversation_id, parent_run_id)

    def _list_runs_sync(self, conversation_id: str | None, parent_run_id: str | None) -> list[RunRecord]:
        try:
            entries = sorted(e.name for e in os.scandir(self.directory) if e.is_dir() and not e.name.startswith('.'))
        except FileNotFoundError:
            return []
        found: list[RunRecord] = []
        for name in entries:
            path = self.directory / name / RUN_FILE
            try:
                record = self._read_run(path)
            except ValueError as exc:
                logger.warning('step_file: skipping run folder %s: %s', path.parent, exc)
                continue
            if record is None:
                continue
            if record.run_id != name:
                logger.warning('step_file: skipping %s: it names run %r, not %r', path, record.run_id, name)
                continue
            if conversation_id is not None and record.conversation_id != conversation_id:
                continue
            if parent_run_id is not None and record.parent_run_id != parent_run_id:
                continue
            found.append(record)
        found.sort(key=lambda r: _sort_time(r.started_at))
        return found

    # -- events -----------------------------------------------------------------------------

    async def append_event(self, event: StepEvent) -> None:
        run_id = validate_path_safe_run_id(event.run_id)
        await self._worker.run(self._write_runs_sync, {run_id: [event]})

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        """Append events and ledger entries, then save `snapshot`, in order, in one thread hand-off.

        Each run's writes are made under one hold of its lock: its events in one append to
        `events.jsonl`, its ledger entries in one append to `tool_effects.jsonl`, then the snapshot.
        Those are separate files, so a crash between them can keep one append and lose another, as
        with separate calls. Every run id is checked before anything is written.
        """
        by_run: dict[str, list[StepWrite]] = {}
        for write in check_writes(writes):
            by_run.setdefault(validate_path_safe_run_id(write.run_id), []).append(write)
        if snapshot is not None:
            await self._save(snapshot, by_run)
        elif by_run:
            await self._worker.run(self._write_runs_sync, by_run)

    def _write_runs_sync(self, by_run: dict[str, list[StepWrite]]) -> None:
        for run_id, writes in by_run.items():
            state = self._state(run_id)
            with self._writing(state) as paths:
                self._append_records(paths, state, writes)

    def _append_records(self, paths: _Paths, state: _RunState, writes: Sequence[StepWrite]) -> None:
        """One run's events and ledger entries, one append to each log (run's lock held)."""
        if not writes:
            return
        events = [w for w in writes if isinstance(w, StepEvent)]
        effects = [w for w in writes if isinstance(w, ToolEffectRecord)]
        if isinstance(writes[0], ToolEffectRecord):
            self._append_effects(paths, state, effects)
            self._append_events(paths, state, events)
        else:
            self._append_events(paths, state, events)
            self._append_effects(paths, state, effects)

    def _append_events(self, paths: _Paths, state: _RunState, events: list[StepEvent]) -> None:
        """Append `events` to the run's trail (run's lock held), skipping idempotency keys already applied."""
        if not events:
            return
        path = paths.events
        with opened_log(path) as fd:
            self._catch_up_events(fd, path, state)
            lines: list[bytes] = []
            seq = state.next_event_seq
            keys: set[str] = set()
            for event in events:
                key = event.idempotency_key
                if key is not None and (key in state.event_keys or key in keys):
                    continue
                lines.append(dump_record_compact(event, exclude=_KEPT_BY_FOLDER, seq=seq) + b'\n')
                seq += 1
                if key is not None:
                    keys.add(key)
            if lines:
                append_lines(fd, state.events, b''.join(lines), sync=self._full)
                state.next_event_seq = seq
                state.event_keys |= keys

    @staticmethod
    def _catch_up_events(fd: int, path: Path, state: _RunState) -> None:
        lines, reset = catch_up(fd, path, state.events, repair=True)
        if reset:
            state.next_event_seq = 1
            state.event_keys.clear()
        for _, data in _json_objects(lines, path):
            seq = data.get('seq')
            if isinstance(seq, int) and seq >= state.next_event_seq:
                state.next_event_seq = seq + 1
            key = data.get('idempotency_key')
            if isinstance(key, str):
                state.event_keys.add(key)

    async def list_events(self, run_id: str) -> list[StepEvent]:
        run_id = validate_path_safe_run_id(run_id)
        return await self._worker.run(self._list_events_sync, run_id)

    def _list_events_sync(self, run_id: str) -> list[StepEvent]:
        with run_lock(self._run_dir(run_id) / LOCK_FILE, exclusive=False):
            path = self._run_dir(run_id) / EVENTS_FILE
            lines = read_complete_lines(path)
        return [load_record(StepEvent, data, run_id=run_id) for _, data in _json_objects(lines, path)]

    # -- snapshots --------------------------------------------------------------------------

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self._save(snapshot, {})

    async def _save(self, snapshot: ContinuableSnapshot, first: dict[str, list[StepWrite]]) -> None:
        """Write the `first` records (see `write_batch`), then the snapshot, in one thread hand-off."""
        run_id = validate_path_safe_run_id(snapshot.run_id)
        state = self._state(run_id)
        key = snapshot.idempotency_key
        if key is not None and key in state.snapshot_keys:
            # applied before (keys are never forgotten); re-checked under the lock otherwise
            if first:
                await self._worker.run(self._write_runs_sync, first)
            return

        def write(delta: HistoryDelta) -> list[NodeId] | None:
            # On the worker thread, where the new messages were just found and encoded.
            nonlocal first
            header = dump_record(snapshot, exclude={'messages'})
            records, first = first, {}  # written once, even when a stale history makes the snapshot retry
            return self._records_then_snapshot_sync(records, run_id, state, key, snapshot.state, header, delta)

        # A message log that lost nodes this process remembers (its folder was deleted or replaced)
        # raises _StaleHistory: the history is then stored afresh.
        await self._history.save_through(run_id, snapshot.messages, self._worker.run, write, stale=_StaleHistory)

    def _records_then_snapshot_sync(
        self,
        first: dict[str, list[StepWrite]],
        run_id: str,
        state: _RunState,
        key: str | None,
        snapshot_state: SnapshotState,
        header: dict[str, Any],
        delta: HistoryDelta,
    ) -> list[NodeId] | None:
        # Other runs' records first; the snapshot's own run gets its records and the snapshot under
        # one hold of its lock.
        others = {other: writes for other, writes in first.items() if other != run_id}
        if others:
            self._write_runs_sync(others)
        return self._save_snapshot_sync(
            run_id, state, key, snapshot_state, header, delta, records=first.get(run_id, ())
        )

    def _save_snapshot_sync(
        self,
        run_id: str,
        state: _RunState,
        key: str | None,
        snapshot_state: SnapshotState,
        header: dict[str, Any],
        delta: HistoryDelta,
        *,
        records: Sequence[StepWrite] = (),
    ) -> list[NodeId] | None:
        """Append `records` (the run's events and ledger entries), then save the snapshot, under one lock hold."""
        with self._writing(state) as paths:
            self._append_records(paths, state, records)
            log_path = paths.snapshot_keys
            with opened_log(log_path) as log_fd:
                self._catch_up_snapshot_log(log_fd, log_path, state)
                if key is not None and key in state.snapshot_keys:
                    return None
                # 1. the new messages, as nodes chained onto the reused prefix
                new_nodes = self._append_nodes(paths.messages, state, delta.parent, delta.new_messages)
                head = self._history.head(delta, new_nodes)
                # 2. the snapshot file, atomically, under a seq no file uses yet
                seq = state.next_snapshot_seq
                while os.path.exists(paths.snapshot(seq)):  # left by a save that crashed before step 3
                    seq += 1
                document = {
                    FORMAT_KEY: RECORD_FORMAT_VERSION,
                    'head': head,
                    'length': delta.total,
                    'snapshot': _compact(header | {'seq': seq}),
                }
                path = paths.snapshot(seq)
                write_atomic(
                    path, json.dumps(document, separators=(',', ':'), ensure_ascii=False).encode(), sync=self._full
                )
                # 3. the save's log line: allocates the seq and records the idempotency key
                entry: dict[str, Any] = {'seq': seq, 'state': snapshot_state.value, 'key': key}
                append_lines(log_fd, state.snapshot_log, _line(entry), sync=self._full)
                state.next_snapshot_seq = seq + 1
                state.live_snapshots[seq] = snapshot_state
                if key is not None:
                    state.snapshot_keys.add(key)
                # 4. retention: snapshot files only, never nodes or media
                self._prune(paths, state)
                return new_nodes

    @staticmethod
    def _catch_up_snapshot_log(fd: int, path: Path, state: _RunState) -> None:
        lines, reset = catch_up(fd, path, state.snapshot_log, repair=True)
        if reset:
            state.next_snapshot_seq = 1
            state.snapshot_keys.clear()
            state.live_snapshots.clear()
        for _, data in _json_objects(lines, path):
            seq = data.get('seq')
            if isinstance(seq, int):
                state.next_snapshot_seq = max(state.next_snapshot_seq, seq + 1)
                with contextlib.suppress(ValueError):
                    state.live_snapshots[seq] = SnapshotState(data.get('state'))
            key = data.get('key')
            if isinstance(key, str):
                state.snapshot_keys.add(key)

    def _append_nodes(
        self, path: Path, state: _RunState, parent: NodeId | None, bodies: Sequence[bytes]
    ) -> list[NodeId]:
        with opened_log(path) as fd:
            lines, reset = catch_up(fd, path, state.nodes, repair=True)
            if reset:
                state.next_node = 0
                state.node_writer.forget()
            for line in lines:
                node_id = node_id_of(line)
                if node_id is None:
                    logger.warning('step_file: skipping a damaged line in %s: %r', path, line[:200])
                    continue
                state.next_node = max(state.next_node, node_id + 1)
            if parent is not None and cast(int, parent) >= state.next_node:
                raise _StaleHistory(parent)
            if not bodies:
                return []
            data, ids, written = state.node_writer.encode(state.next_node, cast(int | None, parent), bodies)
            append_lines(fd, state.nodes, data, sync=self._full)
            state.node_writer.commit(written)
            state.next_node = ids[-1] + 1
            return list(ids)

    def _prune(self, paths: _Paths, state: _RunState) -> None:
        for seq in snapshots_to_prune(state.live_snapshots.items(), self.max_snapshots_per_run):
            with contextlib.suppress(FileNotFoundError):
                paths.snapshot(seq).unlink()
            del state.live_snapshots[seq]

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        run_id = validate_path_safe_run_id(run_id)
        found = await self._worker.run(self._latest_sync, run_id, include_interrupted)
        if found is None:
            return None
        stored, bodies = found
        return await self._decode(stored, bodies)

    def _latest_sync(self, run_id: str, include_interrupted: bool) -> tuple[_StoredSnapshot, list[bytes]] | None:
        run_dir = self._run_dir(run_id)
        nodes: Nodes | None = None
        with run_lock(run_dir / LOCK_FILE, exclusive=False):
            for seq in reversed(self._snapshot_seqs(run_dir)):
                path = run_dir / SNAPSHOTS_DIR / f'{seq}.json'
                try:
                    stored = self._parse_snapshot(path, path.read_bytes(), run_id)
                    if not (include_interrupted or stored.header.state is SnapshotState.COMPLETE):
                        continue
                    if nodes is None:
                        nodes = self._read_nodes(run_dir)
                    return stored, self._chain(stored, nodes)
                except FileNotFoundError:
                    continue  # pruned meanwhile by another process
                except _Uncommitted as exc:
                    logger.warning('step_file: passing over snapshot %s: %s', path, exc)
        return None

    async def list_snapshots(self, run_id: str) -> list[ContinuableSnapshot]:
        run_id = validate_path_safe_run_id(run_id)
        stored, nodes = await self._worker.run(self._list_snapshots_sync, run_id)
        snapshots: list[ContinuableSnapshot] = []
        for item in stored:
            try:
                snapshots.append(await self._decode(item, self._chain(item, nodes)))
            except ValueError as exc:
                logger.warning('step_file: skipping snapshot %d of run %r: %s', item.seq, run_id, exc)
        return snapshots

    def _list_snapshots_sync(self, run_id: str) -> tuple[list[_StoredSnapshot], Nodes]:
        run_dir = self._run_dir(run_id)
        stored: list[_StoredSnapshot] = []
        with run_lock(run_dir / LOCK_FILE, exclusive=False):
            for seq in self._snapshot_seqs(run_dir):
                path = run_dir / SNAPSHOTS_DIR / f'{seq}.json'
                try:
                    stored.append(self._parse_snapshot(path, path.read_bytes(), run_id))
                except FileNotFoundError:
                    continue
                except ValueError as exc:
                    logger.warning('step_file: skipping snapshot file %s: %s', path, exc)
            nodes = self._read_nodes(run_dir) if stored else {}
        return stored, nodes

    @staticmethod
    def _snapshot_seqs(run_dir: Path) -> list[int]:
        try:
            names = os.listdir(run_dir / SNAPSHOTS_DIR)
        except FileNotFoundError:
            return []
        seqs: list[int] = []
        for name in names:
            match = _SNAPSHOT_NAME.fullmatch(name)
            if match is not None:
                seqs.append(int(match.group(1)))
        seqs.sort()
        return seqs

    @staticmethod
    def _parse_snapshot(path: Path, raw: bytes, run_id: str) -> _StoredSnapshot:
        if not raw.strip(b'\x00'):
            raise _Uncommitted(f'snapshot file {str(path)!r} is empty: its write never reached the disk')
        try:
            document: Any = json.loads(raw)
        except ValueError as exc:
            raise ValueError(
                f'snapshot file {str(path)!r} is not valid JSON ({exc}): it is damaged; delete it to fall back '
                'to the previous snapshot'
            ) from None
        if not isinstance(document, dict):
            raise ValueError(f'snapshot file {str(path)!r} does not hold a JSON object: it is damaged; delete it')
        content = cast(dict[str, Any], document)
        check_format_version(content.get(FORMAT_KEY), what=f'snapshot file {str(path)!r}')
        head, length, header = content.get('head'), content.get('length'), content.get('snapshot')
        if (
            not (head is None or (isinstance(head, int) and not isinstance(head, bool)))
            or not isinstance(length, int)
            or isinstance(length, bool)
            or length < 0
            or not isinstance(header, dict)
        ):
            raise ValueError(f'snapshot file {str(path)!r} lacks a valid head, length or snapshot: it is damaged')
        try:
            record = load_record(ContinuableSnapshot, cast(dict[str, Any], header), run_id=run_id)
        except ValueError as exc:
            raise ValueError(f'snapshot file {str(path)!r} cannot be read: {exc}') from exc
        seq = record.seq if record.seq is not None else int(path.stem)
        return _StoredSnapshot(seq=seq, header=record, head=head, length=length)

    @staticmethod
    def _read_nodes(run_dir: Path) -> Nodes:
        path = run_dir / MESSAGES_FILE
        return parse_nodes(read_complete_lines(path), path)

    @staticmethod
    def _chain(stored: _StoredSnapshot, nodes: Nodes) -> list[bytes]:
        """The stored bodies of a snapshot's messages; `_Uncommitted` when some never reached the log."""

        def lookup(node: NodeId) -> tuple[NodeId | None, bytes]:
            found = nodes.get(cast(int, node))
            if found is None:
                raise LookupError(node)
            return found

        try:
            return walk_chain(stored.head, stored.length, lookup)
        except LookupError as exc:
            raise _Uncommitted(
                f'snapshot {stored.seq} of run {stored.header.run_id!r} references message nodes missing from '
                f'{MESSAGES_FILE} ({exc}): its messages were lost (an operating-system crash before they '
                'reached the disk) or the file was damaged'
            ) from None

    async def _decode(self, stored: _StoredSnapshot, bodies: list[bytes]) -> ContinuableSnapshot:
        messages = await self._history.decode(bodies)
        return stored.header.model_copy(update={'messages': messages, 'seq': stored.seq})

    # -- tool effects -----------------------------------------------------------------------

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        run_id = validate_path_safe_run_id(record.run_id)
        await self._worker.run(self._write_runs_sync, {run_id: [record]})

    def _append_effects(self, paths: _Paths, state: _RunState, records: list[ToolEffectRecord]) -> None:
        """Append ledger lines (run's lock held); the latest line of a tool call is its entry."""
        if not records:
            return
        path = paths.effects
        with opened_log(path) as fd:
            self._catch_up_effects(fd, path, state, repair=True)
            lines = [dump_record_compact(record, exclude=_KEPT_BY_FOLDER) + b'\n' for record in records]
            append_lines(fd, state.effects, b''.join(lines), sync=self._full)
            for record, line in zip(records, lines, strict=True):
                state.effect_lines[record.tool_call_id] = line

    @staticmethod
    def _catch_up_effects(fd: int, path: Path, state: _RunState, *, repair: bool) -> None:
        lines, reset = catch_up(fd, path, state.effects, repair=repair)
        if reset:
            state.effect_lines.clear()
        for line, data in _json_objects(lines, path):
            tool_call_id = data.get('tool_call_id')
            if isinstance(tool_call_id, str):
                state.effect_lines[tool_call_id] = line

    def _effect_lines_sync(self, run_id: str, tool_call_id: str | None) -> list[bytes]:
        """The latest ledger line of one tool call (or of every call when `tool_call_id` is None)."""
        state = self._state(run_id)
        with self._reading(state) as paths:
            path = paths.effects
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return []
            try:
                self._catch_up_effects(fd, path, state, repair=False)
            finally:
                os.close(fd)
            if tool_call_id is None:
                return list(state.effect_lines.values())
            line = state.effect_lines.get(tool_call_id)
            return [] if line is None else [line]

    async def _effects(self, run_id: str, tool_call_id: str | None = None) -> list[ToolEffectRecord]:
        lines = await self._worker.run(self._effect_lines_sync, run_id, tool_call_id)
        return [load_record(ToolEffectRecord, line, run_id=run_id) for line in lines]

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        run_id = validate_path_safe_run_id(run_id)
        found = await self._effects(run_id, tool_call_id)
        return found[0] if found else None

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        run_id = validate_path_safe_run_id(run_id)
        return sorted(await self._effects(run_id), key=lambda r: _sort_time(r.started_at))

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return [r for r in await self.list_tool_effects(run_id) if r.status is ToolEffectStatus.STARTED]

    async def aclose(self) -> None:
        with self._states_lock:
            self._states.clear()
        self._worker.close()
