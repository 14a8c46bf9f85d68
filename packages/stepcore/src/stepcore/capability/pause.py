"""A run that ends with `DeferredToolRequests`: its deferred calls, their deadlines, and its pause event.

The pause is written in one batch: the history the run paused with (the model's response with the
deferred calls open and the results of the calls that did run), then the `run_completed` event that
lists the deferred calls (`stepcore.store.waiting`), then the completed entries of the calls whose
results that history holds. Nothing else answers those calls: a paused history is never `complete`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, TypeAlias, cast

import pydantic_core
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import DeferredToolRequests

from stepcore.store.waiting import DeferredCall, DeferredKind

__all__ = ('AnswerWithin', 'check_answer_within', 'deferred_calls')

AnswerWithin: TypeAlias = 'float | timedelta | Mapping[str, float | timedelta] | None'
"""How long a deferred call waits for its answer: seconds or a `timedelta` for every call, a mapping
of tool names to one for the calls of those tools (the others wait as long as it takes), or `None`."""


def _seconds(value: object, *, where: str) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(
            f'StepPersistence answer_within{where}={value!r} is not a duration: pass seconds or a timedelta'
        )
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f'StepPersistence answer_within{where}={value!r} must be a finite duration > 0')
    return seconds


def check_answer_within(value: object) -> dict[str, float] | float | None:
    """`value` as seconds (for every call) or seconds by tool name; `ValueError` naming what is wrong."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        table: dict[str, float] = {}
        for name, duration in cast(Mapping[object, object], value).items():
            if not isinstance(name, str):
                raise ValueError(f'StepPersistence answer_within maps tool names to durations; got the key {name!r}')
            table[name] = _seconds(duration, where=f'[{name!r}]')
        return table
    return _seconds(value, where='')


def _args(call: ToolCallPart) -> Any:
    try:
        return call.args_as_dict()
    except ValueError:  # arguments that are not valid JSON are kept as the model sent them
        return call.args


def _kind(requests: DeferredToolRequests, call: ToolCallPart, approval: bool) -> DeferredKind:
    if approval:
        return 'approval'
    kind = getattr(requests, 'kind', None)  # pydantic-ai releases that tell questions apart
    if callable(kind):
        told = kind(call.tool_call_id)
        if told in ('external', 'question'):
            return cast(DeferredKind, told)
    return 'external'


def deferred_calls(
    requests: DeferredToolRequests, *, now: datetime, within: dict[str, float] | float | None
) -> list[DeferredCall]:
    """The calls `requests` defers, approvals first, each with its deadline (`within` from `now`)."""
    found: list[DeferredCall] = []
    for approval, calls in ((True, requests.approvals), (False, requests.calls)):
        for call in calls:
            seconds = within.get(call.tool_name) if isinstance(within, dict) else within
            metadata = pydantic_core.to_jsonable_python(requests.metadata.get(call.tool_call_id, {}), fallback=repr)
            found.append(
                DeferredCall(
                    tool_call_id=call.tool_call_id,
                    tool_name=call.tool_name,
                    args=_args(call),
                    kind=_kind(requests, call, approval),
                    deadline=None if seconds is None else now + timedelta(seconds=seconds),
                    metadata=cast(dict[str, Any], metadata),
                )
            )
    return found
