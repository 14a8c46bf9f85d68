"""The capability event `StepPersistence` emits after each snapshot write."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic_ai.messages import CapabilityEvent

from .models import SnapshotState

__all__ = ('SnapshotSaved',)


@dataclass(kw_only=True)
class SnapshotSaved(CapabilityEvent, namespace='step_persistence', name='snapshot_saved', dispatch='immediate'):
    """A snapshot was written to the store.

    Emitted after the write completes, so a listener can rely on the snapshot being readable.
    Dispatched immediately, so listeners registered with `Hooks().on.event(SnapshotSaved)` see it
    even when it is emitted at the end of a run. The store is the source of truth: under durable
    replay the notification can repeat, and a failing listener cannot undo the write.
    """

    persistence_run_id: str
    """The run id the snapshot was stored under (the capability's resolved run id)."""
    conversation_id: str | None = None
    step_index: int = 0
    state: SnapshotState = SnapshotState.COMPLETE
