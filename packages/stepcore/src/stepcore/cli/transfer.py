"""Loss-free export of runs to one JSON document, and import into any store.

The document:

    {"stepcore_export": 1,
     "runs": [{"run": {...RunRecord},
               "events": [{...StepEvent}, ...],
               "snapshots": [{...ContinuableSnapshot, "messages": [...]}, ...],
               "tool_effects": [{...ToolEffectRecord}, ...]}]}

Records are written with the stepcore codec (each carries its format version); messages use
pydantic-ai's own serialization (bytes as base64), so an import gives back equal message objects.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from stepcore.store.codec import decode_messages, dump_record, encode_message, load_record
from stepcore.store.models import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord
from stepcore.store.step_store import StepStore

__all__ = ('EXPORT_VERSION', 'RunExport', 'dump_export', 'export_runs', 'import_runs', 'parse_export')

EXPORT_VERSION = 1
EXPORT_KEY = 'stepcore_export'

Progress = Callable[[int], None]
"""Called with the number of records just handled."""


@dataclass(kw_only=True)
class RunExport:
    """Everything stored for one run."""

    run: RunRecord
    events: list[StepEvent] = field(default_factory=list[StepEvent])
    snapshots: list[ContinuableSnapshot] = field(default_factory=list[ContinuableSnapshot])
    tool_effects: list[ToolEffectRecord] = field(default_factory=list[ToolEffectRecord])

    @property
    def size(self) -> int:
        return 1 + len(self.events) + len(self.snapshots) + len(self.tool_effects)

    def as_json(self) -> dict[str, Any]:
        return {
            'run': dump_record(self.run),
            'events': [dump_record(e) for e in self.events],
            'snapshots': [_dump_snapshot(s) for s in self.snapshots],
            'tool_effects': [dump_record(t) for t in self.tool_effects],
        }


def _dump_snapshot(snapshot: ContinuableSnapshot) -> dict[str, Any]:
    data = dump_record(snapshot, exclude={'messages'})
    data['messages'] = [json.loads(encode_message(m)) for m in snapshot.messages]
    return data


def _load_snapshot(data: Mapping[str, Any]) -> ContinuableSnapshot:
    raw = dict(data)
    messages = cast(list[Any], raw.pop('messages', []))
    decoded = decode_messages([json.dumps(m, ensure_ascii=False) for m in messages])
    return load_record(ContinuableSnapshot, raw, messages=decoded)


async def collect_run(store: StepStore, run_id: str, *, progress: Progress | None = None) -> RunExport:
    """Read one run's record, events, snapshots and tool effects; `LookupError` for an unknown run."""
    record = await store.get_run(run_id=run_id)
    if record is None:
        raise LookupError(f'run {run_id!r} not found in this store: list the stored runs with `stepcore runs`')
    export = RunExport(run=record)
    if progress:
        progress(1)
    export.events = await store.list_events(run_id=run_id)
    if progress:
        progress(len(export.events))
    export.snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
    if progress:
        progress(len(export.snapshots))
    export.tool_effects = await store.list_tool_effects(run_id=run_id)
    if progress:
        progress(len(export.tool_effects))
    return export


async def descendant_ids(store: StepStore, run_id: str) -> list[str]:
    """`run_id` and every run delegated from it (depth first, each level oldest first)."""
    ordered: list[str] = []
    seen: set[str] = set()
    stack = [run_id]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        ordered.append(current)
        children = await store.list_runs(parent_run_id=current)
        stack.extend(reversed([c.run_id for c in children]))
    return ordered


async def export_runs(store: StepStore, run_ids: Sequence[str], *, progress: Progress | None = None) -> list[RunExport]:
    return [await collect_run(store, run_id, progress=progress) for run_id in run_ids]


def dump_export(runs: Sequence[RunExport]) -> dict[str, Any]:
    return {EXPORT_KEY: EXPORT_VERSION, 'runs': [r.as_json() for r in runs]}


def parse_export(data: Any) -> list[RunExport]:
    """Parse an export document; `ValueError` describing what is wrong with it."""
    if not isinstance(data, dict) or EXPORT_KEY not in data:
        raise ValueError(f'not a stepcore export: expected a JSON object with a {EXPORT_KEY!r} key')
    doc = cast(dict[str, Any], data)
    version = doc[EXPORT_KEY]
    if not isinstance(version, int) or version < 1:
        raise ValueError(f'invalid export version {version!r}: expected an integer >= 1')
    if version > EXPORT_VERSION:
        raise ValueError(
            f'export version {version} is newer than this stepcore reads (up to {EXPORT_VERSION}): upgrade stepcore'
        )
    runs_raw = doc.get('runs')
    if not isinstance(runs_raw, list):
        raise ValueError('export has no "runs" list')
    result: list[RunExport] = []
    for index, item in enumerate(cast(list[Any], runs_raw)):
        if not isinstance(item, dict):
            raise ValueError(f'export run #{index} is not a JSON object')
        entry = cast(dict[str, Any], item)
        try:
            result.append(
                RunExport(
                    run=load_record(RunRecord, entry['run']),
                    events=[load_record(StepEvent, e) for e in entry.get('events', [])],
                    snapshots=[_load_snapshot(s) for s in entry.get('snapshots', [])],
                    tool_effects=[load_record(ToolEffectRecord, t) for t in entry.get('tool_effects', [])],
                )
            )
        except KeyError as exc:
            raise ValueError(f'export run #{index} lacks the {exc.args[0]!r} field') from None
    return result


async def import_runs(store: StepStore, runs: Sequence[RunExport], *, progress: Progress | None = None) -> None:
    """Write exported runs into `store`, parents before delegates.

    A run id the store already holds raises `ValueError` (nothing of that run is written). The
    store assigns event and snapshot `seq` numbers afresh; they match the source when the source
    kept every snapshot.
    """
    for export in runs:
        if await store.get_run(run_id=export.run.run_id) is not None:
            raise ValueError(
                f'run {export.run.run_id!r} already exists in the target store: import into another store, '
                'or leave that run out of the export'
            )
    for export in runs:
        await store.register_run(export.run)
        if progress:
            progress(1)
        for event in export.events:
            await store.append_event(event)
        if progress:
            progress(len(export.events))
        for snapshot in export.snapshots:
            await store.save_snapshot(snapshot)
            if progress:
                progress(1)
        for effect in export.tool_effects:
            await store.record_tool_effect(effect)
        if progress:
            progress(len(export.tool_effects))
