"""`TemplateStepStore`: a step store on the stepcore engine, one small JSON file per record.

The engine (`stepcore.engine.EngineStore`) does everything a step store must get right: encoding
records, idempotency, incremental snapshots, retention, media, encryption, checksums, the write
order that keeps the crash rule, and damage handling. This module only does I/O: `TemplatePort`
answers each operation of `stepcore.backend.ops` with files under one directory.

    <directory>/
        lock                          locked (flock) by every write (exclusive) and read (shared)
        next-node                     the next message node id of the whole store
        store-id                      the store's id, written when it is first asked for
        media/                        the default media store, for media_store='auto'
        leases/<state>/<run id>       an empty file for each run whose lease is in that state
        runs/<run id>/
            run.json                  the run row
            lease.json                the run's lease: epoch, state, host, expires, body
            lease-start               the start point stored with the lease, as the engine gave it
            events/<seq>.json         an event (<seq>.<key name>.json when it has an idempotency key)
            effects/<call name>.json  a tool call's ledger entry, replaced on each update
            nodes/<node id>.json      one stored message and its parent node
            snapshots/<seq>.json      a snapshot row: state, newest node, length, header
            snapshot-keys/<key name>  an applied snapshot idempotency key

Each file holds a JSON object: the row's columns, and `body`, the record as the engine encoded it
(UTF-8 JSON, kept as a string). Idempotency keys and tool call ids may be any text, so files are
named after their SHA-256 (`key_name`). Every file is written whole under a temporary name and
renamed into place, so a reader never sees half a file.

There are no transactions: a write holds the store's lock and makes its writes in the order the
engine asks for them. A process killed between two leaves the earlier ones, which is what the
engine's write order is designed for (see "Write order and the crash rule" in docs/engine.md).
Files are not fsynced: the data survives a killed process, not a power loss.

Run ownership (feature `leases`): a lease swap is a write like the others, under the same lock, so
it is atomic against every fenced write, whose first operation (`check_lease`) reads the lease
file. Expiry times are on this host's clock (`time.time()`): the store is for one host.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from media_disk import DiskMediaStore
from stepcore.backend import (
    CHECKSUMS,
    ENCRYPTION,
    LEASES,
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
    DamagedRecordError,
    Encryption,
    EngineStore,
    Fenced,
    KeyConflict,
    MediaStoreOption,
    SyncPort,
    WorkerThread,
    make_dir,
    ops,
    validate_path_safe_run_id,
    write_atomic,
)

__all__ = ('TemplatePort', 'TemplateStepStore', 'key_name')

logger = logging.getLogger('stepcore_template')

_NUMBERED = re.compile(r'(\d+)(?:\.([0-9a-f]{64}))?\.json')
"""`<seq>.json` or `<seq>.<key name>.json` (other names, such as temporary files, are not records)."""
_NEVER = datetime(1970, 1, 1, tzinfo=UTC)
"""The start time of a record whose file is damaged: the engine reports it, but it still sorts."""

Document = dict[str, Any] | ops.Unreadable | ops.Unparsable
"""A record file's JSON object, or why it could not be had (the engine reports it as damaged)."""


def key_name(text: str) -> str:
    """The file name for an idempotency key or tool call id: any text, so its SHA-256."""
    return hashlib.sha256(text.encode()).hexdigest()


def _write(path: Path, **fields: Any) -> None:
    make_dir(path.parent)
    write_atomic(path, json.dumps(fields, ensure_ascii=False).encode(), sync=False)


def _read(path: Path) -> Document | None:
    """The JSON object in `path`; `None` when there is no such file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        return ops.Unreadable(f'{path} cannot be read: {error.strerror}')
    try:
        document = json.loads(raw)
    except ValueError as error:
        return ops.Unparsable(f'{path} is not JSON: {error}')
    if not isinstance(document, dict):
        return ops.Unparsable(f'{path} does not hold a JSON object')
    return dict[str, Any](document)  # pyright: ignore[reportUnknownArgumentType]


def _body(document: Document) -> ops.Body:
    """What the engine reads: the stored body, or why the file could not be had."""
    if not isinstance(document, dict):
        return document
    body = document.get('body')
    return body if isinstance(body, str) else ops.Unparsable('the file holds no body')


def _column(document: Document, name: str, default: Any = None) -> Any:
    return document.get(name, default) if isinstance(document, dict) else default


def _time(document: Document) -> datetime:
    try:
        return datetime.fromisoformat(_column(document, 'started_at'))
    except (TypeError, ValueError):
        return _NEVER


def _text(body: ops.Body) -> str:
    """A body the engine hands over to be stored: always bytes, UTF-8 JSON."""
    assert isinstance(body, bytes), f'the engine hands bodies over as bytes, not {type(body).__name__}'
    return body.decode()


def _numbered(folder: Path) -> list[tuple[int, str | None, Path]]:
    """`(seq, key name or None, path)` of each `<seq>[.<key name>].json` file in `folder`, by seq."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = [(m, name) for name in names if (m := _NUMBERED.fullmatch(name))]
    return sorted((int(m[1]), m[2], folder / name) for m, name in found)


class TemplatePort(SyncPort):
    """The engine's operations on the files under `directory` (layout in the module docstring).

    File I/O blocks, so this is a `SyncPort` with a thread of its own: the engine hands it each
    whole write or read in one call.
    """

    name = 'template store'

    def __init__(self, directory: Path) -> None:
        super().__init__(worker=WorkerThread('stepcore-template'))
        self.directory = directory

    def describe(self) -> str:
        return f'directory {str(self.directory)!r}'

    def check_run_id(self, run_id: object) -> str:
        return validate_path_safe_run_id(run_id)  # a run id names a folder

    def run_folder(self, run_id: str) -> Path:
        return self.directory / 'runs' / run_id

    # -- writes and reads: the store's lock -----------------------------------------------------

    @contextmanager
    def _locked(self, how: int) -> Iterator[None]:
        make_dir(self.directory)
        fd = os.open(self.directory / 'lock', os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, how)  # waits for other writers, in this process or another
            yield
        finally:
            os.close(fd)  # releases the lock

    def transaction(self, runs: Sequence[str]) -> Any:
        return self._locked(fcntl.LOCK_EX)

    def reading(self, run_id: str | None) -> Any:
        return self._locked(fcntl.LOCK_SH)

    # -- runs -----------------------------------------------------------------------------------

    def _run_row(self, run_id: str) -> ops.RunRow | None:
        document = _read(self.run_folder(run_id) / 'run.json')
        if document is None:
            return None
        return ops.RunRow(
            run_id=run_id,
            started_at=_time(document),
            conversation_id=_column(document, 'conversation_id'),
            parent_run_id=_column(document, 'parent_run_id'),
            body=_body(document),
        )

    def _run_ids(self) -> list[str]:
        try:
            return os.listdir(self.directory / 'runs')
        except FileNotFoundError:
            return []

    def insert_run(self, tx: Any, op: ops.InsertRun) -> ops.RunRow | None:
        row = op.row
        existing = self._run_row(row.run_id)
        if existing is None:  # the store's lock makes the check and the write one step
            _write(
                self.run_folder(row.run_id) / 'run.json',
                started_at=row.started_at.isoformat(),
                conversation_id=row.conversation_id,
                parent_run_id=row.parent_run_id,
                body=_text(row.body),
            )
        return existing

    def get_run(self, tx: Any, op: ops.GetRun) -> ops.RunRow | None:
        return self._run_row(op.run_id)

    def list_runs(self, tx: Any, op: ops.ListRuns) -> list[ops.RunRow]:
        rows = [row for run_id in self._run_ids() if (row := self._run_row(run_id)) is not None]
        return op.pick(rows)  # filters, order, `after` and `limit`, over rows in memory

    def list_run_ids(self, tx: Any, op: ops.ListRunIds) -> list[str]:
        return [
            run_id
            for run_id in self._run_ids()
            if (self.run_folder(run_id) / 'run.json').exists() or _numbered(self.run_folder(run_id) / 'snapshots')
        ]

    def delete_run(self, tx: Any, op: ops.DeleteRun) -> bool:
        folder = self.run_folder(op.run_id)
        if not folder.exists():
            return False
        # Renamed away in one step, then removed: a process killed meanwhile leaves a `deleted-*`
        # folder outside `runs/` (safe to remove), never half a run. The lease goes with the folder;
        # its marker in the index after it (one a kill leaves behind is passed over: see leases).
        doomed = self.directory / f'deleted-{uuid.uuid4().hex}'
        folder.rename(doomed)
        for marker in self._markers(op.run_id):
            marker.unlink()
        shutil.rmtree(doomed)
        return True

    # -- the store itself -----------------------------------------------------------------------

    def store_identity(self, tx: Any, op: ops.StoreIdentity) -> str:
        path = self.directory / 'store-id'
        if not path.exists():  # the store's lock makes the check and the write one step
            write_atomic(path, op.new_id.encode(), sync=False)
        return path.read_text()

    def store_location(self, tx: Any, op: ops.StoreLocation) -> str:
        return f'directory {os.path.realpath(self.directory)!r}'  # the same for every path to it

    # -- leases: run ownership ------------------------------------------------------------------
    # A swap is a compare and set: the store's lock makes the compare and the set one step, and
    # keeps every fenced write (which starts with `check_lease`) either before a takeover or after.
    # `list_leases` reads an index instead of every run: `leases/<state>/<run id>`, kept beside the
    # lease file, which is the truth (a marker whose run's lease is in another state is passed over).

    def _markers(self, run_id: str) -> list[Path]:
        return list((self.directory / 'leases').glob(f'*/{run_id}'))  # run ids hold no glob characters

    def _lease_row(self, run_id: str) -> ops.LeaseRow | None:
        document = _read(self.run_folder(run_id) / 'lease.json')
        if document is None:
            return None
        if not isinstance(document, dict):  # raised, not guessed: a lease decides who may write
            kind = 'unreadable' if isinstance(document, ops.Unreadable) else 'unparsable'
            raise DamagedRecordError(
                run_id=run_id, record='lease', where=self.describe(), reason=document.reason, kind=kind
            )
        try:
            return ops.LeaseRow(
                run_id=run_id,
                epoch=int(document['epoch']),
                state=str(document['state']),
                host=str(document['host']),
                expires=float(document['expires']),
                body=str(document['body']),
            )
        except (KeyError, TypeError, ValueError) as error:
            reason = f'lease.json lacks a valid column: {type(error).__name__}: {error}'
            raise DamagedRecordError(run_id=run_id, record='lease', where=self.describe(), reason=reason) from None

    def get_lease(self, tx: Any, op: ops.GetLease) -> ops.LeaseRead:
        return ops.LeaseRead(self._lease_row(op.run_id), time.time())

    def swap_lease(self, tx: Any, op: ops.SwapLease) -> ops.LeaseSwap:
        now = time.time()
        current = self._lease_row(op.run_id)
        if not op.matches(current, now):
            return ops.LeaseSwap(False, ops.LeaseRead(current, now))
        row = op.stored(now)  # the new lease, expiring `op.ttl` seconds from now
        folder = self.run_folder(op.run_id)  # may not exist yet: a run takes its lease before it registers
        if op.start is not None:
            make_dir(folder)
            write_atomic(folder / 'lease-start', op.start, sync=False)
        # The new state's marker, then the lease, then the other markers: a process killed in between
        # leaves a marker too many, never a live lease missing from the index. `ended` is never listed.
        if row.state != 'ended':
            marker = self.directory / 'leases' / row.state / op.run_id
            make_dir(marker.parent)
            marker.touch(mode=0o600)
        body = row.body if isinstance(row.body, str) else row.body.decode()
        _write(folder / 'lease.json', epoch=row.epoch, state=row.state, host=row.host, expires=row.expires, body=body)
        for marker in self._markers(op.run_id):
            if marker.parent.name != row.state:
                marker.unlink()
        return ops.LeaseSwap(True, ops.LeaseRead(row, now))

    def list_leases(self, tx: Any, op: ops.ListLeases) -> tuple[list[ops.LeaseRow], float]:
        rows: list[ops.LeaseRow] = []
        for state in sorted(set(op.states)):
            folder = self.directory / 'leases' / state
            for run_id in os.listdir(folder) if folder.is_dir() else []:
                try:
                    row = self._lease_row(run_id)
                except DamagedRecordError as error:  # a listing passes over a damaged record, saying so
                    logger.warning('skipping a damaged lease: %s', error)
                    continue
                if row is not None and row.state == state:
                    rows.append(row)
        return rows, time.time()

    def get_lease_start(self, tx: Any, op: ops.GetLeaseStart) -> bytes | None:
        folder = self.run_folder(op.run_id)
        if not (folder / 'lease.json').exists():
            return None  # a start point whose swap was killed before it wrote the lease
        path = folder / 'lease-start'
        return path.read_bytes() if path.exists() else None

    def check_lease(self, tx: Any, op: ops.CheckLease) -> None:
        row = self._lease_row(op.run_id)
        if row is None or row.epoch != op.epoch:
            raise Fenced(op.run_id)  # another owner took the run: this write stores nothing

    # -- events ---------------------------------------------------------------------------------

    def put_events(self, tx: Any, op: ops.PutEvents) -> None:
        folder = self.run_folder(op.run_id) / 'events'
        stored = _numbered(folder)
        seq = stored[-1][0] if stored else 0
        keys = {key for _, key, _ in stored if key is not None}
        for row in op.rows:
            name = f'{seq + 1}.json'
            if row.idempotency_key is not None:
                key = key_name(row.idempotency_key)
                if key in keys:
                    continue
                keys.add(key)
                name = f'{seq + 1}.{key}.json'  # the key in the name: one write, one listing finds it
            seq += 1
            _write(folder / name, idempotency_key=row.idempotency_key, body=_text(row.body))

    def list_events(self, tx: Any, op: ops.ListEvents) -> list[ops.EventRow]:
        stored = [(seq, path) for seq, _, path in _numbered(self.run_folder(op.run_id) / 'events')]
        if op.after_seq is not None:
            stored = [(seq, path) for seq, path in stored if seq > op.after_seq]
        if op.limit is not None:
            stored = stored[-op.limit :] if op.newest else stored[: op.limit]
        rows: list[ops.EventRow] = []
        for seq, path in stored:
            document = _read(path)
            if document is not None:
                rows.append(ops.EventRow(op.run_id, _column(document, 'idempotency_key'), _body(document), seq=seq))
        return rows

    # -- the tool-effect ledger -----------------------------------------------------------------

    def put_effects(self, tx: Any, op: ops.PutEffects) -> None:
        for row in op.rows:
            folder = self.run_folder(row.run_id) / 'effects'
            path = folder / f'{key_name(row.tool_call_id)}.json'
            earlier = _read(path)
            # the ledger lists calls in the order they were first recorded: an update keeps its place
            order = _column(earlier, 'order') if earlier is not None else None
            if not isinstance(order, int):
                order = len(os.listdir(folder)) + 1 if folder.exists() else 1
            _write(
                path,
                tool_call_id=row.tool_call_id,
                status=row.status,
                started_at=row.started_at.isoformat(),
                order=order,
                body=_text(row.body),
            )

    def list_effects(self, tx: Any, op: ops.ListEffects) -> list[ops.EffectRow]:
        folder = self.run_folder(op.run_id) / 'effects'
        if op.tool_call_id is not None:
            paths = [folder / f'{key_name(op.tool_call_id)}.json']
        else:
            paths = sorted(folder.glob('*.json'))
        found: list[tuple[int, ops.EffectRow]] = []
        for path in paths:
            document = _read(path)
            if document is None:
                continue
            row = ops.EffectRow(
                run_id=op.run_id,
                tool_call_id=_column(document, 'tool_call_id', op.tool_call_id or path.stem),
                status=_column(document, 'status', ''),
                started_at=_time(document),
                body=_body(document),
            )
            order = _column(document, 'order', 0)
            found.append((order if isinstance(order, int) else 0, row))
        return [row for _, row in sorted(found, key=lambda pair: pair[0])]

    # -- snapshots and their message nodes ------------------------------------------------------

    def snapshot_key_applied(self, tx: Any, op: ops.SnapshotKeyApplied) -> bool:
        return (self.run_folder(op.run_id) / 'snapshot-keys' / key_name(op.key)).exists()

    def node_exists(self, tx: Any, op: ops.NodeExists) -> bool:
        return (self.run_folder(op.run_id) / 'nodes' / f'{op.node}.json').exists()

    def snapshot_states(self, tx: Any, op: ops.SnapshotStates) -> list[tuple[int, str]]:
        return [(row.seq or 0, row.state) for row in self._snapshot_rows(op.run_id)]

    def _new_node_ids(self, count: int) -> list[int]:
        """`count` node ids never handed out before in this store, not even to a run since deleted."""
        counter = self.directory / 'next-node'
        first = int(counter.read_text()) if counter.exists() else 1
        write_atomic(counter, str(first + count).encode(), sync=False)
        return list(range(first, first + count))

    def put_snapshot(self, tx: Any, op: ops.PutSnapshot) -> list[int]:
        folder = self.run_folder(op.run_id)
        key_file = folder / 'snapshot-keys' / key_name(op.key) if op.key is not None else None
        if key_file is not None and key_file.exists():
            raise KeyConflict(op.key)
        # In the order the operation gives: the new message nodes, the row, then the key.
        ids = self._new_node_ids(len(op.bodies))
        head = op.parent
        for node, body in zip(ids, op.bodies, strict=True):
            _write(folder / 'nodes' / f'{node}.json', parent=head, body=body.decode())
            head = node
        # The engine's retention never prunes a run's newest snapshot, so one past it is a new seq.
        stored = _numbered(folder / 'snapshots')
        seq = stored[-1][0] + 1 if stored else 1
        row = op.row
        snapshot = folder / 'snapshots' / f'{seq}.json'
        _write(snapshot, state=row.state, head=head, length=row.length, body=_text(row.body))
        if key_file is not None:
            _write(key_file, key=op.key)
        return ids

    def delete_snapshots(self, tx: Any, op: ops.DeleteSnapshots) -> None:
        for seq in op.seqs:  # only the rows: message nodes and keys stay
            (self.run_folder(op.run_id) / 'snapshots' / f'{seq}.json').unlink(missing_ok=True)

    def _snapshot_rows(self, run_id: str) -> list[ops.SnapshotRow]:
        rows: list[ops.SnapshotRow] = []
        for seq, _, path in _numbered(self.run_folder(run_id) / 'snapshots'):
            document = _read(path)
            if document is None:
                continue
            head, length = _column(document, 'head'), _column(document, 'length', 0)
            rows.append(
                ops.SnapshotRow(
                    run_id=run_id,
                    state=_column(document, 'state', ''),
                    head=head if isinstance(head, int) else None,
                    length=length if isinstance(length, int) else 0,
                    body=_body(document),
                    seq=seq,
                )
            )
        return rows

    def list_snapshots(self, tx: Any, op: ops.ListSnapshots) -> list[ops.SnapshotRow]:
        rows = self._snapshot_rows(op.run_id)
        if op.complete_only:
            rows = [row for row in rows if row.state == 'complete']
        return rows[-1:] if op.newest else rows

    def get_nodes(self, tx: Any, op: ops.GetNodes) -> dict[int, ops.Node]:
        # Walk each chain from its head through the parents; a missing node ends the walk, and the
        # engine reports the chain as broken.
        folder = self.run_folder(op.run_id) / 'nodes'
        nodes: dict[int, ops.Node] = {}
        for head, length in op.chains:
            node: int | None = head
            for _ in range(length):
                if node is None or node in nodes:
                    break
                document = _read(folder / f'{node}.json')
                body = _column(document, 'body') if document is not None else None
                if document is None or not isinstance(body, str):
                    break
                parent = _column(document, 'parent')
                nodes[node] = (parent if isinstance(parent, int) else None, body.encode())
                node = nodes[node][0]
        return nodes


class TemplateStepStore(EngineStore):
    """Runs kept as one small JSON file per record under `directory`.

    Args:
        directory: where the store keeps its files (created when first written).
        max_snapshots_per_run: keep at most this many snapshots per run (the engine prunes).
        media_store: where binary content and large strings go: `'auto'` (the default) for a
            `DiskMediaStore` in `directory/media`, `None` to keep them inline, or a media store.
        media_threshold_bytes: strings at least this long go to the media store (64 KiB default).
        encryption: encrypt bodies and media at rest (see the Security page).

    Users subclass stores and give their subclass private attributes of its own: keep whatever
    state a store class needs in name-mangled attributes (`self.__client`), never `self._client`.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {PERSISTENT, SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, ENCRYPTION, CHECKSUMS, LEASES}
    )

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStoreOption = 'auto',
        media_threshold_bytes: int | None = None,
        encryption: Encryption | None = None,
    ) -> None:
        self.directory = Path(directory)
        super().__init__(
            TemplatePort(self.directory),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            # made only for 'auto'; None and a media store pass through
            default_media_store=lambda: DiskMediaStore(self.directory / 'media'),
            media_threshold_bytes=media_threshold_bytes,
            encryption=encryption,
        )
