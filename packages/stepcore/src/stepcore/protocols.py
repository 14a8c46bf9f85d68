"""`StepStore`: the contract every step store keeps, as a base class with its derived methods written once."""

from __future__ import annotations

import inspect
import warnings
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, ClassVar, Self, TypeAlias, cast

from .models import (
    ContinuableSnapshot,
    RunRecord,
    SnapshotState,
    SnapshotSummary,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)

__all__ = ('StepStore', 'StepWrite', 'check_event_window', 'check_writes', 'sort_time')

StepWrite: TypeAlias = StepEvent | ToolEffectRecord
"""One write `StepStore.write_batch` applies: an event to append or a ledger entry to upsert."""


def check_event_window(after_seq: object, limit: object) -> None:
    """`ValueError` naming a bad `after_seq` / `limit` of `StepStore.list_events_page`."""
    if after_seq is not None and (isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0):
        raise ValueError(
            f'after_seq={after_seq!r} is not a sequence number: pass the seq of the last event you have (0 or more), '
            'or None to start at the first event'
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f'limit={limit!r} is not a positive whole number: pass how many events you want, or None')


def event_window(
    events: Sequence[StepEvent], after_seq: int | None, limit: int | None, newest: bool
) -> list[StepEvent]:
    """The events `list_events_page` answers, cut from the run's events in append order."""
    found = [e for e in events if after_seq is None or (e.seq is not None and e.seq > after_seq)]
    if limit is None:
        return found
    return found[-limit:] if newest else found[:limit]


def sort_time(moment: datetime) -> datetime:
    """`moment` as an aware datetime for ordering (a naive one is taken as UTC)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def check_writes(writes: Sequence[object]) -> Sequence[StepWrite]:
    """`writes` unchanged when every item is a `StepEvent` or `ToolEffectRecord`; `TypeError` otherwise.

    `write_batch` calls it first, so a bad batch is refused before anything is written.
    """
    for index, write in enumerate(writes):
        if not isinstance(write, StepEvent | ToolEffectRecord):
            raise TypeError(
                f'write_batch got {type(write).__name__} at position {index}: '
                'pass StepEvent and ToolEffectRecord objects only (snapshots go through save_snapshot)'
            )
    return writes  # pyright: ignore[reportReturnType]  # checked item by item above


class StepStore(ABC):
    """Async persistence for runs, step events, snapshots and the tool-effect ledger.

    Subclass it and implement the abstract methods (a class that leaves one out cannot be
    instantiated), or subclass `stepcore.engine.EngineStore`, which implements all of them over a
    small I/O port. The other methods are derived from those and can be overridden for speed.

    Guarantees every store keeps (checked by `stepcore-conformance`):

    - `register_run` raises `ValueError` for a run id already registered, unless the stored record
      carries the same non-`None` `registration_id` (a retried registration), which is a no-op.
    - `list_runs` filters combine with AND and results are sorted by `started_at` ascending.
    - Events and snapshots with an `idempotency_key` the run already applied are suppressed;
      a `None` key always appends. Events keep their append order within a run.
    - `save_snapshot` copies: mutating the messages afterwards does not change what is stored.
      The store assigns a per-run monotonic `seq`.
    - `latest_snapshot` returns the newest `complete` snapshot, or the newest of any state with
      `include_interrupted=True`; `None` when there is none. `list_snapshots` filters the same
      way: the `complete` snapshots by default, all of them with `include_interrupted=True`, in
      write order.
    - `record_tool_effect` upserts on `(run_id, tool_call_id)`: the latest write wins.
    - `write_batch` writes its snapshot before its records, atomically where the backend can: a
      `completed` ledger entry never becomes durable before the snapshot that holds its result.
    - With `max_snapshots_per_run=N`, each save prunes the run to the newest N snapshots plus the
      newest snapshot overall and the newest complete one.
    - `delete_run` removes the run's record, events, snapshots and ledger.

    Stores are async context managers: `async with SomeStore(...) as store:` closes it on exit.
    """

    features: ClassVar[frozenset[str]] = frozenset()
    """Optional behaviours this backend provides (see `stepcore.features`), declared once, here."""

    # -- runs ---------------------------------------------------------------------------------

    @abstractmethod
    async def register_run(self, record: RunRecord) -> None:
        """Store a new run's record; `ValueError` if the run id is taken by another registration."""

    @abstractmethod
    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or `None`."""

    @abstractmethod
    async def list_runs(
        self, *, conversation_id: str | None = None, parent_run_id: str | None = None
    ) -> list[RunRecord]:
        """Runs matching every given filter, oldest `started_at` first."""

    @abstractmethod
    async def delete_run(self, run_id: str) -> bool:
        """Remove the run's record, events, snapshots and ledger; False when there was nothing to remove.

        Media blobs stay: they are content-addressed and may be shared with other runs.
        """

    # -- events -------------------------------------------------------------------------------

    @abstractmethod
    async def append_event(self, event: StepEvent) -> None:
        """Append to the run's event trail (suppressed when its idempotency key was applied)."""

    @abstractmethod
    async def list_events(self, run_id: str) -> list[StepEvent]:
        """The run's events in append order."""

    async def list_events_page(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None, newest: bool = False
    ) -> list[StepEvent]:
        """A window of the run's events, in append order: those after `after_seq` (a `seq` you
        have read), at most `limit` of them, the last ones when `newest=True`.

        Page forward by passing the `seq` of the last event of a page as the next `after_seq`;
        `newest=True, limit=1` reads the run's latest event. Stores that can read a window
        without reading the whole trail override this.
        """
        check_event_window(after_seq, limit)
        return event_window(await self.list_events(run_id), after_seq, limit, newest)

    # -- snapshots ----------------------------------------------------------------------------

    @abstractmethod
    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        """Store a copy of the snapshot (suppressed when its idempotency key was applied)."""

    @abstractmethod
    async def list_snapshots(self, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        """The run's retained `complete` snapshots, or all of them with `include_interrupted=True`,
        oldest `seq` first (write order)."""

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        """The newest complete snapshot, or the newest of any state with `include_interrupted=True`."""
        found = await self.list_snapshots(run_id, include_interrupted=include_interrupted)
        return found[-1] if found else None

    async def list_snapshot_summaries(self, run_id: str, *, include_interrupted: bool = False) -> list[SnapshotSummary]:
        """`list_snapshots` without the messages: each retained snapshot's seq, state, step and
        message count, oldest first. Stores that keep messages apart override this to read none."""
        return [
            SnapshotSummary.of(s) for s in await self.list_snapshots(run_id, include_interrupted=include_interrupted)
        ]

    async def get_snapshot(self, run_id: str, seq: int) -> ContinuableSnapshot | None:
        """The retained snapshot with this `seq` (complete or interrupted), or `None`."""
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise ValueError(f'seq={seq!r} is not a snapshot sequence number: pass the `seq` of a stored snapshot')
        for snapshot in await self.list_snapshots(run_id, include_interrupted=True):
            if snapshot.seq == seq:
                return snapshot
        return None

    # -- tool effects -------------------------------------------------------------------------

    @abstractmethod
    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        """Insert or replace the ledger entry for `(record.run_id, record.tool_call_id)`."""

    @abstractmethod
    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        """Every ledger entry of the run, oldest `started_at` first."""

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        """One ledger entry, or `None`."""
        for record in await self.list_tool_effects(run_id):
            if record.tool_call_id == tool_call_id:
                return record
        return None

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        """Entries still `started`: the call may or may not have happened."""
        return [r for r in await self.list_tool_effects(run_id) if r.status is ToolEffectStatus.STARTED]

    # -- several writes at once ---------------------------------------------------------------

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        """Save `snapshot` (if given), then apply `writes` in order, as the single-record methods would.

        Events keep their order and idempotency-key suppression (a key repeated within the batch is
        applied once); ledger entries upsert, so a later entry for the same call wins. The snapshot
        goes first so that a `completed` ledger entry is never durable before the snapshot holding
        the call's result. Stores with transactions apply the batch atomically. A write of another
        type raises `TypeError` before anything is written.

        This default makes one call per record; stores override it to write the batch at once.
        """
        check_writes(writes)
        if snapshot is not None:
            await self.save_snapshot(snapshot)
        for write in writes:
            if isinstance(write, StepEvent):
                await self.append_event(write)
            else:
                await self.record_tool_effect(write)

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release connections or clients the store opened itself."""
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        features: object = cls.__dict__.get('features', cls.features)
        if not isinstance(features, frozenset):
            raise TypeError(f'{cls.__name__}.features must be a frozenset of feature names, got {features!r}')
        own: object = cls.__dict__.get('list_snapshots')
        if callable(own) and not _takes_include_interrupted(own):
            cls.list_snapshots = _filtered(cls.__name__, own)  # pyright: ignore[reportAttributeAccessIssue]
            warnings.warn(
                f'{cls.__qualname__}.list_snapshots takes no include_interrupted keyword (the earlier signature): '
                'stepcore takes its answer as every snapshot of the run and keeps only the complete ones unless '
                'include_interrupted=True is passed. Declare it as '
                '`async def list_snapshots(self, run_id, *, include_interrupted=False)` and filter in the store.',
                DeprecationWarning,
                stacklevel=3,
            )


ListAll: TypeAlias = Callable[[Any, str], Awaitable[list[ContinuableSnapshot]]]
"""A store's `list_snapshots(self, run_id)` of the earlier signature: every snapshot of the run."""


def _takes_include_interrupted(method: Callable[..., object]) -> bool:
    """Whether a `list_snapshots` override accepts `include_interrupted=` (by name or through `**kwargs`)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return True  # no signature to read: call it as the contract says
    return 'include_interrupted' in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _filtered(owner: str, list_all: Callable[..., object]) -> Callable[..., Awaitable[list[ContinuableSnapshot]]]:
    """`list_snapshots` of the current signature over an override of the earlier one, which answers
    every snapshot: the complete ones are kept unless `include_interrupted=True`."""
    every = cast(ListAll, list_all)

    async def list_snapshots(self: Any, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        found = await every(self, run_id)
        if include_interrupted:
            return found
        return [s for s in found if SnapshotState(s.state) is SnapshotState.COMPLETE]

    list_snapshots.__qualname__ = f'{owner}.list_snapshots'
    list_snapshots.__doc__ = list_all.__doc__
    return list_snapshots
