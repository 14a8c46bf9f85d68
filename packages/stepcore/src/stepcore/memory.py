"""`InMemoryStepStore`: process-local, for tests and short-lived agents."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from .features import MEDIA_EXTERNALIZATION, SNAPSHOT_RETENTION, require_feature
from .history import HistoryIndex, walk_chain
from .media import MediaStore
from .models import ContinuableSnapshot, RunRecord, SnapshotState, StepEvent, ToolEffectRecord, ToolEffectStatus
from .protocols import StepStore, StepWrite
from .registration import check_registration
from .retention import check_max_snapshots, snapshots_to_prune
from .walker import MediaWalker
from .writes import check_writes

__all__ = ('InMemoryStepStore',)


@dataclass(slots=True)
class _StoredSnapshot:
    seq: int
    header: ContinuableSnapshot  # messages left empty
    head: int | None
    length: int


@dataclass(slots=True)
class _Run:
    events: list[StepEvent] = field(default_factory=list[StepEvent])
    event_keys: set[str] = field(default_factory=set[str])
    nodes: list[tuple[int | None, bytes]] = field(default_factory=list[tuple[int | None, bytes]])
    snapshots: list[_StoredSnapshot] = field(default_factory=list[_StoredSnapshot])
    snapshot_keys: set[str] = field(default_factory=set[str])
    next_seq: int = 1
    effects: dict[str, ToolEffectRecord] = field(default_factory=dict[str, ToolEffectRecord])


class InMemoryStepStore(StepStore):
    """Keeps everything in process memory.

    Snapshots are stored as encoded messages (the same incremental node scheme as the persistent
    stores), so a later mutation of a message object never changes a stored snapshot and a long
    run does not pay a full copy of its history per step.
    """

    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION})

    def __init__(
        self,
        *,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStore | None = None,
        media_threshold_bytes: int | None = None,
    ) -> None:
        if media_store is not None or media_threshold_bytes is not None:
            # Messages stay in process memory as they are: there is nothing to externalize to.
            require_feature(self, MEDIA_EXTERNALIZATION, option='media_store / media_threshold_bytes')
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        self._runs_by_id: dict[str, RunRecord] = {}
        self._data: dict[str, _Run] = {}
        self._history = HistoryIndex(MediaWalker(None))

    def _run(self, run_id: str) -> _Run:
        data = self._data.get(run_id)
        if data is None:
            data = self._data[run_id] = _Run()
        return data

    async def register_run(self, record: RunRecord) -> None:
        existing = self._runs_by_id.get(record.run_id)
        if check_registration(existing, record):
            self._runs_by_id[record.run_id] = record.model_copy(deep=True)

    async def get_run(self, run_id: str) -> RunRecord | None:
        record = self._runs_by_id.get(run_id)
        return record.model_copy(deep=True) if record is not None else None

    async def list_runs(
        self, *, conversation_id: str | None = None, parent_run_id: str | None = None
    ) -> list[RunRecord]:
        found = [
            r.model_copy(deep=True)
            for r in self._runs_by_id.values()
            if (conversation_id is None or r.conversation_id == conversation_id)
            and (parent_run_id is None or r.parent_run_id == parent_run_id)
        ]
        found.sort(key=lambda r: r.started_at)
        return found

    async def append_event(self, event: StepEvent) -> None:
        self._append_event(event)

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        """Apply events and ledger entries in order, then the snapshot (see `stepcore.protocols.BatchWriter`)."""
        for write in check_writes(writes):
            if isinstance(write, StepEvent):
                self._append_event(write)
            else:
                self._record_tool_effect(write)
        if snapshot is not None:
            await self.save_snapshot(snapshot)

    def _append_event(self, event: StepEvent) -> None:
        data = self._run(event.run_id)
        key = event.idempotency_key
        if key is not None:
            if key in data.event_keys:
                return
            data.event_keys.add(key)
        data.events.append(event.model_copy(deep=True, update={'seq': len(data.events) + 1}))

    async def list_events(self, run_id: str) -> list[StepEvent]:
        data = self._data.get(run_id)
        return [e.model_copy(deep=True) for e in data.events] if data else []

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        data = self._run(snapshot.run_id)
        key = snapshot.idempotency_key
        if key is not None and key in data.snapshot_keys:
            return
        delta = await self._history.delta(snapshot.run_id, snapshot.messages)
        if key is not None and key in data.snapshot_keys:  # a concurrent save won meanwhile
            return
        new_nodes: list[int] = []
        parent = delta.parent
        for body in delta.new_messages:
            data.nodes.append((parent if isinstance(parent, int) else None, body))
            parent = len(data.nodes) - 1
            new_nodes.append(parent)
        self._history.commit(delta, new_nodes)
        head = self._history.head(delta, new_nodes)
        if key is not None:
            data.snapshot_keys.add(key)
        seq = data.next_seq
        data.next_seq += 1
        header = snapshot.model_copy(deep=True, update={'messages': [], 'seq': seq})
        data.snapshots.append(
            _StoredSnapshot(seq=seq, header=header, head=head if isinstance(head, int) else None, length=delta.total)
        )
        prune = set(snapshots_to_prune(((s.seq, s.header.state) for s in data.snapshots), self.max_snapshots_per_run))
        if prune:
            data.snapshots = [s for s in data.snapshots if s.seq not in prune]

    async def _materialize(self, data: _Run, stored: _StoredSnapshot) -> ContinuableSnapshot:
        bodies = walk_chain(stored.head, stored.length, lambda node: data.nodes[node])  # type: ignore[index]
        messages = await self._history.decode(bodies)
        return stored.header.model_copy(deep=True, update={'messages': messages})

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        data = self._data.get(run_id)
        if data is None:
            return None
        for stored in reversed(data.snapshots):
            if include_interrupted or stored.header.state is SnapshotState.COMPLETE:
                return await self._materialize(data, stored)
        return None

    async def list_snapshots(self, run_id: str) -> list[ContinuableSnapshot]:
        data = self._data.get(run_id)
        if data is None:
            return []
        return [await self._materialize(data, s) for s in data.snapshots]

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        self._record_tool_effect(record)

    def _record_tool_effect(self, record: ToolEffectRecord) -> None:
        self._run(record.run_id).effects[record.tool_call_id] = record.model_copy(deep=True)

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        data = self._data.get(run_id)
        record = data.effects.get(tool_call_id) if data else None
        return record.model_copy(deep=True) if record is not None else None

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        data = self._data.get(run_id)
        if data is None:
            return []
        return sorted((r.model_copy(deep=True) for r in data.effects.values()), key=lambda r: r.started_at)

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return [r for r in await self.list_tool_effects(run_id) if r.status is ToolEffectStatus.STARTED]

    async def aclose(self) -> None:
        return None
