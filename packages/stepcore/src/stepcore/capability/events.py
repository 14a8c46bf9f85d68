"""The capability event `StepPersistence` emits after each snapshot write, and its emission."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import CapabilityEvent
from pydantic_ai.tools import RunContext

from stepcore.store.models import ContinuableSnapshot, SnapshotState

__all__ = ('SnapshotSaved', 'announce_snapshot')

logger = logging.getLogger('stepcore')


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


async def announce_snapshot(ctx: RunContext[Any], snapshot: ContinuableSnapshot) -> None:
    """Emit `SnapshotSaved` for a written `snapshot` through `ctx` (from a capability hook).

    A context without an event stream (one not built by a running agent) cannot deliver it: the
    notification is dropped there, and the write stands.
    """
    event = SnapshotSaved(
        persistence_run_id=snapshot.run_id,
        conversation_id=snapshot.conversation_id,
        step_index=snapshot.step_index,
        state=snapshot.state,
    )
    try:
        await ctx.emit(event)
    except UserError:
        if _has_event_stream(ctx):
            raise
        logger.debug('SnapshotSaved for run %r not emitted: this RunContext has no event stream', snapshot.run_id)


def _has_event_stream(ctx: RunContext[Any]) -> bool:
    """Whether `ctx` is backed by a running agent's event stream.

    pydantic-ai (2.68) has no public way to ask: `RunContext.emit` raises the same `UserError` for a
    context without a stream as for an event it refuses, and only the private `_event_stream_buffer`
    tells them apart. Should that attribute go, every context counts as one without a stream, so a
    refused notification never fails the run (the snapshot is written either way).
    """
    return getattr(ctx, '_event_stream_buffer', None) is not None
