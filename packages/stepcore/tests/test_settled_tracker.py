"""SettledTracker: the incremental `is_provider_valid` the capability uses at every tool cycle."""

from __future__ import annotations

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from stepcore import is_provider_valid
from stepcore.capability.settled import SettledTracker


def _call(*ids: str) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart('t', {}, tool_call_id=i) for i in ids])


def _answer(*ids: str) -> ModelRequest:
    return ModelRequest(parts=[ToolReturnPart('t', 'ok', tool_call_id=i) for i in ids])


def test_a_growing_history_gets_the_same_answers_as_a_full_scan() -> None:
    tracker = SettledTracker()
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    for i in range(30):
        history = [*history, _call(f'c{i}')]
        assert tracker.is_provider_valid(history) is is_provider_valid(history) is False
        history = [*history, _answer(f'c{i}')]
        assert tracker.is_provider_valid(history) is is_provider_valid(history) is True
    history = [*history, ModelResponse(parts=[TextPart('done')])]
    assert tracker.is_provider_valid(history) is True


def test_calls_answered_many_steps_later_and_retries_count() -> None:
    tracker = SettledTracker()
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')]), _call('early', 'c0')]
    history.append(_answer('c0'))
    for i in range(1, 6):
        history += [_call(f'c{i}'), _answer(f'c{i}')]
        assert tracker.is_provider_valid(history) is False  # 'early' is still unanswered
    history.append(ModelRequest(parts=[ToolReturnPart('t', 'try again', tool_call_id='early', outcome='retried')]))
    assert tracker.is_provider_valid(history) is True


def test_the_newest_messages_are_rescanned_when_changed_in_place() -> None:
    tracker = SettledTracker()
    request = ModelRequest(parts=[])
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')]), _call('c1'), request]
    assert tracker.is_provider_valid(history) is False
    request.parts = [ToolReturnPart('t', 'ok', tool_call_id='c1')]  # filled in place, as pydantic-ai may
    assert tracker.is_provider_valid(history) is True


def test_a_rewritten_history_is_scanned_whole() -> None:
    tracker = SettledTracker()
    first: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    for i in range(5):
        first += [_call(f'c{i}'), _answer(f'c{i}')]
    assert tracker.is_provider_valid(first) is True
    # a compaction replaced the early messages: an answer that was there is gone
    rewritten: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('summary')]), _call('c0'), *first[3:]]
    assert tracker.is_provider_valid(rewritten) is is_provider_valid(rewritten) is False
    # a shorter history than the one scanned before
    assert tracker.is_provider_valid(first[:2]) is False
    assert tracker.is_provider_valid(first[:3]) is True
