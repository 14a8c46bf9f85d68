"""Loading stored histories back into a run, and annotating in-flight tool effects."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    RetryPromptPart,  # pyright: ignore[reportDeprecated]
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.tools import RunContext

from stepcore.capability.context import active_tool_call
from stepcore.engine.history import TAIL_RECHECK, shares_prefix, starts_with
from stepcore.recovery.paused import read_pause
from stepcore.store.contract import as_step_store
from stepcore.store.ids import dotted_run_id
from stepcore.store.protocols import StepStore, StepStoreProtocol

__all__ = ('annotate_tool_effect', 'continue_run', 'fork_run', 'is_provider_valid', 'unanswered_tool_calls')


def _scan_tool_calls(messages: Iterable[ModelMessage], pending: dict[str, ToolCallPart]) -> bool:
    """Add the tool calls of `messages` to `pending` and drop those a later request answers.

    `pending` holds the open calls in the order they were made; the first answer to a call consumes
    it. Returns False when a request answers a call that is not open (never made, or answered
    already), True otherwise.
    """
    paired = True
    for message in messages:
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart):
                    pending[part.tool_call_id] = part
        elif isinstance(message, ModelRequest):  # pyright: ignore[reportUnnecessaryIsInstance]
            for part in message.parts:
                call_id = _answered_call(part)
                if call_id is not None and pending.pop(call_id, None) is None:
                    paired = False
    return paired


def _answered_call(part: ModelRequestPart) -> str | None:
    """The id of the tool call `part` answers: a tool return, or a retry prompt bound to a tool."""
    if isinstance(part, ToolReturnPart):
        return part.tool_call_id
    if isinstance(part, RetryPromptPart) and part.tool_name is not None:  # pyright: ignore[reportDeprecated]
        return part.tool_call_id
    return None


def unanswered_tool_calls(messages: Sequence[ModelMessage]) -> list[ToolCallPart]:
    """Tool calls in `messages` that no later request answers, in order."""
    pending: dict[str, ToolCallPart] = {}
    _scan_tool_calls(messages, pending)
    return list(pending.values())


class SettledTracker:
    """`is_provider_valid` for one run's growing history, scanning only what is new at each call.

    It remembers the message objects it scanned, short of the newest `history.TAIL_RECHECK` (which
    pydantic-ai may still change in place), the calls left open after them and whether an answer
    among them had no open call. When a later history starts with those very objects only the rest
    is scanned; any other history is scanned whole.
    """

    def __init__(self) -> None:
        self._scanned: list[ModelMessage] = []
        self._pending: dict[str, ToolCallPart] = {}
        self._paired = True

    def is_provider_valid(self, messages: Sequence[ModelMessage]) -> bool:
        start = len(self._scanned)
        if start and not self._continues(messages):  # equal messages pair their calls alike
            self._scanned, self._pending, self._paired, start = [], {}, True, 0
        boundary = max(start, len(messages) - TAIL_RECHECK)
        self._paired = _scan_tool_calls(messages[start:boundary], self._pending) and self._paired
        self._scanned.extend(messages[start:boundary])
        if not self._paired:
            return False
        tail = dict(self._pending)
        return _scan_tool_calls(messages[boundary:], tail) and not tail

    def _continues(self, messages: Sequence[ModelMessage]) -> bool:
        """Whether `messages` begins with the scanned messages (the list is the tracker's own)."""
        if isinstance(messages, list) and len(messages) >= len(self._scanned):
            return shares_prefix(self._scanned, messages, len(self._scanned))
        return starts_with(messages, self._scanned)


def is_provider_valid(messages: Sequence[ModelMessage]) -> bool:
    """True when every tool call in `messages` is answered once, after it, and every answer has its call.

    Calls are matched by `tool_call_id`, in order: a `ToolReturnPart` (a retried call's included)
    or a tool-bound `RetryPromptPart` answers the open call with its id and closes it. A history
    is invalid when a call is left open, or when an answer finds no open call: one whose call was
    never made, comes later, or was answered already. A `RetryPromptPart` without `tool_name`
    answers no call and is always fine.

    This is what makes a snapshot `complete`: a provider accepts the history as it stands and no
    tool work is left unsettled. Native (provider-run) tool calls are settled inside their own
    response and are not counted.
    """
    pending: dict[str, ToolCallPart] = {}
    return _scan_tool_calls(messages, pending) and not pending


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


async def annotate_tool_effect(
    store: StepStoreProtocol,
    ctx: RunContext[Any],
    *,
    idempotency_key: str | None = None,
    effect_summary: str | None = None,
) -> None:
    """Attach how to deduplicate, and what, a tool's side effect is to its in-flight ledger entry.

    Call it from inside a tool, before doing the side effect. The fields are merged into the
    `started` record of this tool call and kept when the call's terminal record is written. Outside
    a tool call wrapped by `StepPersistence` it does nothing.
    """
    active = active_tool_call()
    if active is None or ctx.tool_call_id is None or active.tool_call_id != ctx.tool_call_id:
        return
    await active.capability.annotate(
        ctx, store, active.tool_call_id, idempotency_key=idempotency_key, effect_summary=effect_summary
    )
