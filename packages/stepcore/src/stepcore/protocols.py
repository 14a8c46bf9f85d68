"""The store protocol every backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol, TypeAlias, runtime_checkable

from .models import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord

__all__ = ('BatchWriter', 'StepStore', 'StepWrite')

StepWrite: TypeAlias = StepEvent | ToolEffectRecord
"""One write `BatchWriter.write_batch` applies: an event to append or a ledger entry to upsert."""


@runtime_checkable
class StepStore(Protocol):
    """Async persistence for runs, step events, snapshots and the tool-effect ledger.

    Guarantees every store keeps (checked by `stepcore-conformance`):

    - `register_run` raises `ValueError` for a run id already registered, unless the stored record
      carries the same non-`None` `registration_id` (a retried registration), which is a no-op.
    - `list_runs` filters combine with AND and results are sorted by `started_at` ascending.
    - Events and snapshots with an `idempotency_key` the run already applied are suppressed;
      a `None` key always appends. Events keep their append order within a run.
    - `save_snapshot` copies: mutating the messages afterwards does not change what is stored.
      The store assigns a per-run monotonic `seq`.
    - `latest_snapshot` returns the newest `complete` snapshot, or the newest of any state with
      `include_interrupted=True`; `None` when there is none.
    - `record_tool_effect` upserts on `(run_id, tool_call_id)`: the latest write wins.
    - With `max_snapshots_per_run=N`, each save prunes the run to the newest N snapshots plus the
      newest snapshot overall and the newest complete one.
    """

    features: ClassVar[frozenset[str]]
    """Optional behaviours this backend provides (see `stepcore.features`)."""

    async def register_run(self, record: RunRecord) -> None:
        """Store a new run's record; `ValueError` if the run id is taken by another registration."""
        ...

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or `None`."""
        ...

    async def list_runs(
        self, *, conversation_id: str | None = None, parent_run_id: str | None = None
    ) -> list[RunRecord]:
        """Runs matching every given filter, oldest `started_at` first."""
        ...

    async def append_event(self, event: StepEvent) -> None:
        """Append to the run's event trail (suppressed when its idempotency key was applied)."""
        ...

    async def list_events(self, run_id: str) -> list[StepEvent]:
        """The run's events in append order."""
        ...

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        """Store a copy of the snapshot (suppressed when its idempotency key was applied)."""
        ...

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        """The newest complete snapshot, or the newest of any state with `include_interrupted=True`."""
        ...

    async def list_snapshots(self, run_id: str) -> list[ContinuableSnapshot]:
        """The run's retained snapshots, oldest `seq` first."""
        ...

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        """Insert or replace the ledger entry for `(record.run_id, record.tool_call_id)`."""
        ...

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        """One ledger entry, or `None`."""
        ...

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        """Every ledger entry of the run, oldest `started_at` first."""
        ...

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        """Entries still `started`: the call may or may not have happened."""
        ...

    async def aclose(self) -> None:
        """Release connections or clients the store opened itself."""
        ...


@runtime_checkable
class BatchWriter(Protocol):
    """Optional extra a `StepStore` can implement: several writes in one call.

    `StepPersistence` writes a tool call's ledger entry and its event together, and a finished
    call's entry and event with the snapshot that follows it; a store with `write_batch` takes
    each group in one round trip (one transaction, one thread hand-off) instead of one per record.
    Stores without it get one call per write (`stepcore.writes.apply_writes`).
    """

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        """Apply `writes` in order, then save `snapshot` (if given), as the single-record methods would.

        Events keep their order and idempotency-key suppression (a key repeated within the batch is
        applied once); ledger entries upsert, so a later entry for the same call wins; the snapshot
        is saved exactly as by `save_snapshot`. Stores with transactions apply the batch
        atomically. A write of another type raises `TypeError`, and a batch that cannot be applied
        (an invalid run id, say) raises before anything is written.
        """
        ...
