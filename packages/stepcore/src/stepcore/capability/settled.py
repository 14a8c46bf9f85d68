"""Whether a history's tool calls are settled: every call answered once, after it, and every answer
with its call. This is what makes a snapshot `complete`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    RetryPromptPart,  # pyright: ignore[reportDeprecated]
    ToolCallPart,
    ToolReturnPart,
)

from stepcore.engine import TAIL_RECHECK, shares_prefix, starts_with

__all__ = ('SettledTracker', 'is_provider_valid', 'unanswered_tool_calls')


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

    It remembers the message objects it scanned, short of the newest `stepcore.engine.TAIL_RECHECK` (which
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
