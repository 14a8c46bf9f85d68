"""A run and its resumptions: forward to the newest continuation, back to the newest complete snapshot.

- Forward (`continuations`): a run that was resumed is never resumed again; recovery acts on its
  newest continuation instead. The link is the run's lease (`resumed_by`) on a store that keeps
  leases; elsewhere the runs whose record says they resume it (`RESUMES_KEY`), newest first.
- Back (`back_to_snapshot`): a resumption killed before it saved a complete snapshot got no further
  than the cut cycle, so its history starts from the run it resumes; the chain is followed back
  until a run with a complete snapshot, or, for a run killed before its first settled step, the
  start point its lease kept (the history and prompt it was started with). A run that paused on
  deferred tool calls stops the walk too: the history it paused with is where it carries on.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepcore.capability.context import RESUMES_KEY
from stepcore.ownership.claims import has_leases
from stepcore.recovery.paused import Waiting, read_pause
from stepcore.store.models import ContinuableSnapshot, RunRecord, SnapshotState
from stepcore.store.step_store import StepStore

__all__ = ('Chain', 'back_to_snapshot', 'continuations', 'resumed_by')


async def resumed_by(store: StepStore, run_id: str) -> str | None:
    """The run that continues `run_id`, or `None`."""
    if has_leases(store):
        lease = await store.get_lease(run_id)
        if lease is not None:
            return lease.resumed_by
    return await _newest_resuming(store, run_id)


async def _newest_resuming(store: StepStore, run_id: str) -> str | None:
    """The newest run whose record says it resumes `run_id` (read from the run's conversation, or from
    every run when it has none): how a store without leases tells a run was resumed."""
    record = await store.get_run(run_id=run_id)
    if record is None:
        return None
    conversation = record.conversation_id
    runs: list[RunRecord] = (
        await store.list_runs(conversation_id=conversation) if conversation is not None else await store.list_runs()
    )
    resuming = [r for r in runs if r.metadata.get(RESUMES_KEY) == run_id]
    return resuming[-1].run_id if resuming else None


async def _resumes(store: StepStore, run_id: str) -> str | None:
    """The run `run_id` resumes: from its record, or from its lease (a resumption that took the run
    over and was killed before it registered has a lease and no record)."""
    record = await store.get_run(run_id=run_id)
    origin = record.metadata.get(RESUMES_KEY) if record is not None else None
    if origin is None and has_leases(store):
        lease = await store.get_lease(run_id)
        origin = lease.resumes if lease is not None else None
    return origin if isinstance(origin, str) else None


async def continuations(store: StepStore, run_id: str) -> list[str]:
    """`run_id` and the runs that continue it, in order: the last one is the run recovery acts on."""
    chain = [run_id]
    while (following := await resumed_by(store, chain[-1])) is not None and following not in chain:
        chain.append(following)
    return chain


@dataclass(frozen=True)
class Chain:
    """A run and the runs it resumes, newest first, back to the history it can start from."""

    runs: list[str]
    settled: ContinuableSnapshot | None
    """The newest complete snapshot of the chain, or the start point of its oldest run (`from_start`)."""
    from_start: bool = False
    """Whether `settled` is the start point a lease kept, not a saved snapshot."""
    paused: Waiting | None = None
    """The pause of the oldest run of the chain, when it paused on deferred tool calls: then `settled` is
    the history it paused with (its deferred calls open), not a complete snapshot."""


async def back_to_snapshot(store: StepStore, run_id: str) -> Chain:
    """`run_id` and the runs it resumes (`RESUMES_KEY`, or its lease's `resumes`), newest first, back
    to the first that paused on deferred tool calls, with the history it paused with, or saved a
    complete snapshot, with that snapshot; else back to the oldest, with its start point (when its
    store kept one), else with none."""
    chain = [run_id]
    while True:
        paused = await read_pause(store, chain[-1])
        if paused is not None and paused.snapshot is not None:
            return Chain(chain, paused.snapshot, paused=paused)
        if (settled := await store.latest_snapshot(run_id=chain[-1])) is not None:
            return Chain(chain, settled)
        origin = await _resumes(store, chain[-1])
        if origin is None or origin in chain:
            break
        chain.append(origin)
    start = await store.lease_start(chain[-1]) if has_leases(store) else None
    if start is None:
        return Chain(chain, None)
    point = ContinuableSnapshot(run_id=chain[-1], step_index=0, messages=start, state=SnapshotState.COMPLETE)
    return Chain(chain, point, from_start=True)
