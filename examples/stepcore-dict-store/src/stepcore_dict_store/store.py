"""`DictStepStore`: the `StepStore` contract written by hand over a few dicts.

It subclasses `StepStore` and implements its abstract methods itself; the derived ones
(`latest_snapshot`, `get_tool_effect`, `list_unresolved_tool_effects`, `write_batch`, `async with`)
come from the base class. It keeps each snapshot's messages encoded with stepcore's codec, so a
later change to a message object never reaches what was stored. It declares no optional feature:
asked for snapshot retention or media externalization, it refuses instead of silently ignoring the
option. (A store built on `stepcore.engine.EngineStore` implements a small port instead and gets
retention, media, damage handling and the crash-window checks from the engine.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from stepcore import ContinuableSnapshot, RunRecord, SnapshotState, StepEvent, StepStore, ToolEffectRecord
from stepcore.codec import decode_messages, encode_messages
from stepcore.features import ENCRYPTION, MEDIA_EXTERNALIZATION, SNAPSHOT_RETENTION, require_feature
from stepcore.media import resolve_media_store
from stepcore.registration import check_registration

__all__ = ('DictStepStore',)

_FEATURE_OPTIONS = {
    'encryption': ENCRYPTION,
    'max_snapshots_per_run': SNAPSHOT_RETENTION,
    'media_threshold_bytes': MEDIA_EXTERNALIZATION,
}


@dataclass
class _Stored:
    header: ContinuableSnapshot  # the snapshot without its messages
    messages: list[bytes]


@dataclass
class _Run:
    events: list[StepEvent] = field(default_factory=list[StepEvent])
    event_keys: set[str] = field(default_factory=set[str])
    snapshots: list[_Stored] = field(default_factory=list[_Stored])
    snapshot_keys: set[str] = field(default_factory=set[str])
    effects: dict[str, ToolEffectRecord] = field(default_factory=dict[str, ToolEffectRecord])


class DictStepStore(StepStore):
    """Every run, event, snapshot and tool effect in process memory."""

    features: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, **options: Any) -> None:
        # media_store='auto' (every store's default, which callers may pass) is no media store here,
        # and so is None; a media store of the caller's is refused, a bogus value too.
        media_store = resolve_media_store(
            options.pop('media_store', 'auto'), default=lambda: None, owner='DictStepStore'
        )
        if media_store is not None:
            require_feature(self, MEDIA_EXTERNALIZATION, option='media_store')
        for option in options:
            if option in _FEATURE_OPTIONS:
                require_feature(self, _FEATURE_OPTIONS[option], option=option)
        if options:
            raise TypeError(f'DictStepStore takes no options, got {sorted(options)}')
        self._records: dict[str, RunRecord] = {}
        self._runs: dict[str, _Run] = {}

    def _run(self, run_id: str) -> _Run:
        return self._runs.setdefault(run_id, _Run())

    async def register_run(self, record: RunRecord) -> None:
        if check_registration(self._records.get(record.run_id), record):
            self._records[record.run_id] = record.model_copy(deep=True)

    async def get_run(self, run_id: str) -> RunRecord | None:
        record = self._records.get(run_id)
        return record.model_copy(deep=True) if record else None

    async def list_runs(
        self, *, conversation_id: str | None = None, parent_run_id: str | None = None
    ) -> list[RunRecord]:
        found = [
            r.model_copy(deep=True)
            for r in self._records.values()
            if (conversation_id is None or r.conversation_id == conversation_id)
            and (parent_run_id is None or r.parent_run_id == parent_run_id)
        ]
        return sorted(found, key=lambda r: r.started_at)

    async def append_event(self, event: StepEvent) -> None:
        run = self._run(event.run_id)
        if event.idempotency_key is not None:
            if event.idempotency_key in run.event_keys:
                return
            run.event_keys.add(event.idempotency_key)
        run.events.append(event.model_copy(update={'seq': len(run.events) + 1}, deep=True))

    async def list_events(self, run_id: str) -> list[StepEvent]:
        return [e.model_copy(deep=True) for e in self._run(run_id).events]

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        run = self._run(snapshot.run_id)
        if snapshot.idempotency_key is not None:
            if snapshot.idempotency_key in run.snapshot_keys:
                return
            run.snapshot_keys.add(snapshot.idempotency_key)
        seq = run.snapshots[-1].header.seq + 1 if run.snapshots and run.snapshots[-1].header.seq else 1
        header = snapshot.model_copy(update={'messages': [], 'seq': seq}, deep=True)
        run.snapshots.append(_Stored(header, encode_messages(snapshot.messages)))

    @staticmethod
    def _load(stored: _Stored) -> ContinuableSnapshot:
        return stored.header.model_copy(update={'messages': decode_messages(stored.messages)}, deep=True)

    async def list_snapshots(self, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        return [
            self._load(s)
            for s in self._run(run_id).snapshots
            if include_interrupted or s.header.state is SnapshotState.COMPLETE
        ]

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        self._run(record.run_id).effects[record.tool_call_id] = record.model_copy(deep=True)

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        effects = [e.model_copy(deep=True) for e in self._run(run_id).effects.values()]
        return sorted(effects, key=lambda e: e.started_at)

    async def delete_run(self, run_id: str) -> bool:
        had_record = self._records.pop(run_id, None) is not None
        return self._runs.pop(run_id, None) is not None or had_record
