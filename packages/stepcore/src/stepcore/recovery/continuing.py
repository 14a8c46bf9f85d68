"""Loading a stored history back into a run: `continue_run` and `fork_run`."""

from __future__ import annotations

from pydantic_ai.messages import ModelMessage

from stepcore.recovery.paused import read_pause
from stepcore.store.contract import as_step_store
from stepcore.store.ids import dotted_run_id
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.step_store import StepStore

__all__ = ('continue_run', 'fork_run')


async def continue_run(
    store: StepStoreProtocol, *, run_id: str, include_interrupted: bool = False
) -> list[ModelMessage]:
    """The messages of the run's newest settled snapshot, to pass as `message_history=`.

    With `include_interrupted=True` the newest snapshot of any state is used (check
    `store.list_unresolved_tool_effects(run_id=run_id)` first). A run that paused on deferred tool
    calls (it ended with `DeferredToolRequests`) continues from the history it paused with, whose
    deferred calls are open: pass it with `deferred_tool_results=`, or let `resume_run` hand over the
    answers recorded in the store. Raises `LookupError` ("no continuable snapshot for run_id ...")
    when the run has no matching snapshot.
    """
    bound = as_step_store(store)
    if not include_interrupted and (paused := await read_pause(bound, run_id)) is not None and paused.snapshot:
        return paused.snapshot.messages
    snapshot = await bound.latest_snapshot(run_id=run_id, include_interrupted=include_interrupted)
    if snapshot is None:
        raise LookupError(
            await _no_snapshot_message(
                bound, run_id, include_interrupted=include_interrupted, name=type(store).__name__
            )
        )
    return snapshot.messages


async def _no_snapshot_message(store: StepStore, run_id: str, *, include_interrupted: bool, name: str) -> str:
    which = 'snapshot' if include_interrupted else 'complete snapshot'
    message = f'no continuable snapshot for run_id {run_id!r}: the run has no {which} in {name}'
    older = dotted_run_id(run_id)
    if older is not None and await store.get_run(run_id=older) is not None:
        return (
            f'{message}. This agent run was recorded by stepcore 0.1 under run_id {older!r}: '
            f'pass run_id={older!r} to read it'
        )
    if not include_interrupted:
        message += ' (pass include_interrupted=True to consider interrupted ones)'
    return message


async def fork_run(store: StepStoreProtocol, *, run_id: str, include_interrupted: bool = False) -> list[ModelMessage]:
    """Like `continue_run`, for starting a new branch from the snapshot.

    Pass the result to a new `Agent.run` (which gets its own run id); give it a fresh
    `conversation_id` to keep the branch apart from the original dialogue.
    """
    return await continue_run(store, run_id=run_id, include_interrupted=include_interrupted)
