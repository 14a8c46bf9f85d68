"""How stepcore reaches a store: through the reference's contract, and through an extension only
where the store's own class provides it.

`StepPersistence` and the helpers accept any store that keeps the reference's protocol
(`stepcore.store.protocols.StepStoreProtocol`): a `StepStore` subclass, or a class of the user's own
with just those methods, or a wrapper that overrides some of them and forwards the rest through
`__getattr__`. `as_step_store` gives each the full `StepStore` interface:

- a `StepStore` subclass is used as it is;
- any other object is wrapped in a `ProtocolStore`, which calls its contract methods by keyword
  (found however the object finds them, `__getattr__` included) and takes an extension
  (`write_batch`, paging, partial reads, maintenance) from it only when the object's class defines
  it; otherwise the extension is derived from the contract as the `StepStore` base derives it.

An extension stands in for contract methods (`write_batch` for `save_snapshot`, `append_event`
and `record_tool_effect`; `list_events_page` for `list_events`; ...). It is used only when no
method it stands in for is overridden by a class below the one that defines the extension: a
subclass of a store that overrides `save_snapshot` sees every snapshot, because the batched write
of its parent class would go around it. `own_extension` decides this, once, for every caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar, cast

from stepcore.store.adapters import paged_list_runs, takes_keywords
from stepcore.store.lifecycle import PruneProgress, PruneReport, RunPage
from stepcore.store.models import (
    ContinuableSnapshot,
    RunRecord,
    SnapshotMessages,
    SnapshotSummary,
    StepEvent,
    ToolEffectRecord,
)
from stepcore.store.protocols import CONTRACT_METHODS, StepStoreProtocol, StepWrite
from stepcore.store.registration import check_registration
from stepcore.store.step_store import StepStore

__all__ = ('EXTENSIONS', 'ProtocolStore', 'as_step_store', 'is_step_store_subclass', 'own_extension', 'write_records')

_SNAPSHOT_READS = ('latest_snapshot', 'list_snapshots')

EXTENSIONS: Mapping[str, tuple[str, ...]] = {
    'write_batch': ('save_snapshot', 'append_event', 'record_tool_effect'),
    'list_events_page': ('list_events',),
    'list_runs_page': ('list_runs',),
    'list_snapshots': ('latest_snapshot',),
    'list_snapshot_summaries': _SNAPSHOT_READS,
    'get_snapshot': _SNAPSHOT_READS,
    'get_snapshot_messages': _SNAPSHOT_READS,
    'shared_message_count': _SNAPSHOT_READS,
    'list_tool_effects': ('get_tool_effect', 'list_unresolved_tool_effects'),
    'delete_run': (),
    'delete_conversation': ('delete_run', 'list_runs'),
    'prune': ('delete_run', 'list_runs'),
    'stored_run_ids': ('list_runs',),
    'check_integrity': (),
    'counts_records': (),
    'media_references': _SNAPSHOT_READS,
    'stored_key_ids': (),
    'get_lease': (),
    'swap_lease': (),
    'list_leases': (),
    'lease_start': (),
    'store_identity': (),
    'store_location': (),
    'is_transient': (),
    'aclose': (),
}
"""Each extension stepcore uses, and the contract methods it stands in for."""

R = TypeVar('R', RunRecord, StepEvent, ContinuableSnapshot, ToolEffectRecord)


def is_step_store_subclass(store: object) -> bool:
    """Whether the store's class derives from `StepStore` (not merely has its methods)."""
    return StepStore in type(store).__mro__


def _owner(cls: type, name: str) -> type | None:
    """The class in `cls`'s method resolution order that defines `name` (never `__getattr__`)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def own_extension(store: object, name: str) -> bool:
    """Whether stepcore may call the store's own `name` (see the module docstring).

    True when the store's class defines `name` and no contract method it stands in for is
    defined by a class below the one that defines it.
    """
    cls = type(store)
    owner = _owner(cls, name)
    if owner is None:
        return False
    for part in EXTENSIONS.get(name, ()):
        part_owner = _owner(cls, part)
        if part_owner is not None and part_owner is not owner and issubclass(part_owner, owner):
            return False
    return True


def as_step_store(store: object) -> StepStore:
    """`store` as a `StepStore`: itself for a subclass, a `ProtocolStore` around anything else.

    `TypeError` naming the methods it lacks when it does not keep the contract.
    """
    if is_step_store_subclass(store):
        return cast(StepStore, store)
    missing = [name for name in CONTRACT_METHODS if not callable(getattr(store, name, None))]
    if missing:
        raise TypeError(
            f'{type(store).__name__} cannot be used as a step store: it has no {", ".join(missing)}. '
            'A store needs the methods of stepcore.StepStoreProtocol (or subclass stepcore.StepStore)'
        )
    return ProtocolStore(cast(StepStoreProtocol, store))


async def write_records(
    store: StepStore,
    writes: Sequence[StepWrite],
    *,
    snapshot: ContinuableSnapshot | None = None,
    own: bool | None = None,
) -> None:
    """Save `snapshot`, then apply `writes`: through the store's `write_batch` where it is its own
    (see `own_extension`), else one contract call per record, in that order.

    Either way a `completed` ledger entry never reaches the store before the snapshot holding the
    call's result. `own` is `own_extension(store, 'write_batch')` when the caller knows it already
    (a run's writer asks once per run, not once per write).
    """
    if own if own is not None else own_extension(store, 'write_batch'):
        await store.write_batch(writes, snapshot=snapshot)
    else:
        await StepStore.write_batch(store, writes, snapshot=snapshot)


def ours(cls: type[R], record: object) -> R:
    """`record` as a stepcore record of `cls`: itself, or one built from its fields (a record of
    another library with the reference's fields, as a user's store may return)."""
    if isinstance(record, cls):
        return record
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        fields: Mapping[str, Any] = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    elif callable(dump := getattr(record, 'model_dump', None)):
        fields = cast(Mapping[str, Any], dump())
    elif isinstance(record, Mapping):
        fields = cast(Mapping[str, Any], record)
    else:
        fields = cast(Mapping[str, Any], vars(record))
    return cls.model_validate(fields)


def _maybe(cls: type[R], record: object) -> R | None:
    return None if record is None else ours(cls, record)


class ProtocolStore(StepStore):
    """A store that keeps the reference's contract, with the rest of `StepStore` around it.

    Contract methods go to the wrapped object by keyword; an extension goes to it only when its
    class defines one (see `own_extension`), else it is derived from the contract. Records it
    returns of another type with the same fields are converted to stepcore's. A run id taken by
    another registration is refused here (`ValueError`), since a store written to the reference
    may overwrite it. The wrapped object is `inner`.
    """

    def __init__(self, inner: StepStoreProtocol) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f'<ProtocolStore around {self.inner!r}>'

    def _own(self, name: str) -> Any:
        """The inner store's own extension `name`, or `None` (see `own_extension`)."""
        return getattr(self.inner, name) if own_extension(self.inner, name) else None

    # -- the contract ---------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        existing = await self.get_run(run_id=record.run_id)
        if check_registration(existing, record):
            await self.inner.register_run(record)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return _maybe(RunRecord, await self.inner.get_run(run_id=run_id))

    async def list_runs(self, **filters: Any) -> list[RunRecord]:
        own = self.inner.list_runs
        if takes_keywords(own, 'limit', 'cursor'):
            return [ours(RunRecord, r) for r in await own(**filters)]

        async def by_lineage(**lineage: str | None) -> list[RunRecord]:
            return [ours(RunRecord, r) for r in await own(**lineage)]

        return await paged_list_runs(self, by_lineage, filters)

    async def append_event(self, event: StepEvent) -> None:
        await self.inner.append_event(event)

    async def list_events(self, run_id: str) -> list[StepEvent]:
        return [ours(StepEvent, e) for e in await self.inner.list_events(run_id=run_id)]

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self.inner.save_snapshot(snapshot)

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        found = await self.inner.latest_snapshot(run_id=run_id, include_interrupted=include_interrupted)
        return _maybe(ContinuableSnapshot, found)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self.inner.record_tool_effect(record)

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        found = await self.inner.get_tool_effect(run_id=run_id, tool_call_id=tool_call_id)
        return _maybe(ToolEffectRecord, found)

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return [ours(ToolEffectRecord, r) for r in await self.inner.list_unresolved_tool_effects(run_id=run_id)]

    # -- extensions: the inner store's own, else derived ----------------------------------------

    async def list_snapshots(self, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        own = self._own('list_snapshots')
        if own is None:
            return await super().list_snapshots(run_id, include_interrupted=include_interrupted)
        if takes_keywords(own, 'include_interrupted'):
            found = await own(run_id=run_id, include_interrupted=include_interrupted)
        else:
            every = [ours(ContinuableSnapshot, s) for s in await own(run_id=run_id)]
            found = every if include_interrupted else [s for s in every if s.state == 'complete']
        return [ours(ContinuableSnapshot, s) for s in found]

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        own = self._own('list_tool_effects')
        if own is None:
            return await super().list_tool_effects(run_id)
        return [ours(ToolEffectRecord, r) for r in await own(run_id=run_id)]

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        own = self._own('write_batch')
        if own is None:
            await super().write_batch(writes, snapshot=snapshot)
        else:
            await own(writes, snapshot=snapshot)

    async def list_events_page(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None, newest: bool = False
    ) -> list[StepEvent]:
        own = self._own('list_events_page')
        if own is None:
            return await super().list_events_page(run_id, after_seq=after_seq, limit=limit, newest=newest)
        return [ours(StepEvent, e) for e in await own(run_id, after_seq=after_seq, limit=limit, newest=newest)]

    async def list_runs_page(self, **filters: Any) -> RunPage:
        own = self._own('list_runs_page')
        return await (own(**filters) if own is not None else super().list_runs_page(**filters))

    async def list_snapshot_summaries(self, run_id: str, *, include_interrupted: bool = False) -> list[SnapshotSummary]:
        own = self._own('list_snapshot_summaries')
        if own is None:
            return await super().list_snapshot_summaries(run_id, include_interrupted=include_interrupted)
        return await own(run_id, include_interrupted=include_interrupted)

    async def get_snapshot(self, run_id: str, seq: int) -> ContinuableSnapshot | None:
        own = self._own('get_snapshot')
        if own is None:
            return await super().get_snapshot(run_id, seq)
        return _maybe(ContinuableSnapshot, await own(run_id, seq))

    async def get_snapshot_messages(
        self, run_id: str, seq: int, *, start: int = 0, stop: int | None = None
    ) -> SnapshotMessages | None:
        own = self._own('get_snapshot_messages')
        if own is None:
            return await super().get_snapshot_messages(run_id, seq, start=start, stop=stop)
        return await own(run_id, seq, start=start, stop=stop)

    async def shared_message_count(self, run_id: str, seq: int, other_seq: int) -> int:
        own = self._own('shared_message_count')
        if own is None:
            return await super().shared_message_count(run_id, seq, other_seq)
        return await own(run_id, seq, other_seq)

    async def delete_run(self, run_id: str) -> bool:
        own = self._own('delete_run')
        return await (own(run_id) if own is not None else super().delete_run(run_id))

    async def delete_conversation(self, conversation_id: str, *, include_delegates: bool = False) -> int:
        own = self._own('delete_conversation')
        if own is None:
            return await super().delete_conversation(conversation_id, include_delegates=include_delegates)
        return await own(conversation_id, include_delegates=include_delegates)

    async def prune(
        self,
        older_than: timedelta,
        *,
        conversation_id: str | None = None,
        dry_run: bool = False,
        progress: PruneProgress | None = None,
    ) -> PruneReport:
        own = self._own('prune')
        if own is None:
            return await super().prune(older_than, conversation_id=conversation_id, dry_run=dry_run, progress=progress)
        return await own(older_than, conversation_id=conversation_id, dry_run=dry_run, progress=progress)

    async def stored_run_ids(self) -> list[str]:
        own = self._own('stored_run_ids')
        return list(await own()) if own is not None else await super().stored_run_ids()

    async def check_integrity(self) -> list[str] | None:
        own = self._own('check_integrity')
        return await own() if own is not None else await super().check_integrity()

    async def counts_records(self, run_id: str) -> bool | None:
        own = self._own('counts_records')
        return await own(run_id) if own is not None else await super().counts_records(run_id)

    async def media_references(self, run_id: str) -> set[str]:
        own = self._own('media_references')
        return set(await own(run_id)) if own is not None else await super().media_references(run_id)

    async def stored_key_ids(self, run_id: str) -> set[str | None]:
        own = self._own('stored_key_ids')
        return set(await own(run_id)) if own is not None else await super().stored_key_ids(run_id)

    def is_transient(self, error: BaseException) -> bool:
        own = self._own('is_transient')
        return bool(own(error)) if own is not None else super().is_transient(error)

    async def store_identity(self) -> str | None:
        own = self._own('store_identity')
        return await own() if own is not None else await super().store_identity()

    async def store_location(self) -> str | None:
        own = self._own('store_location')
        return await own() if own is not None else await super().store_location()

    async def aclose(self) -> None:
        own = self._own('aclose')
        if own is not None:
            await own()
