"""How a run paused on deferred tool calls is stored: its pause, and the answers given to it.

pydantic-ai ends a run with `DeferredToolRequests` when the model called tools that need a person's
approval or a result from outside. Such a run is *waiting*, not completed:

- its `run_completed` event carries `WAITING_KEY`: the deferred calls (`DeferredCall`: tool, arguments,
  kind, deadline), as JSON; its newest snapshot is the history it paused with (the model's response
  with the deferred calls open, and the results of the calls that did run);
- each answer is one event on the run, `tool_call_completed` for the deferred call, carrying
  `ANSWER_KEY` (`Answer`: the decision, who gave it and when) and the idempotency key
  `answer_key(tool_call_id)`: a store applies one such key once, so the first answer stands and any
  other is suppressed, in every store that keeps the contract.

Events of existing kinds carry both, so a store written to the reference's contract keeps them as
it keeps any event. A run's status (`stepcore.store.lifecycle.run_status`) is `waiting` while its
newest event is its pause or an answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeAlias, cast

import pydantic_core

from stepcore.store.models import EventKind, StepEvent

__all__ = (
    'ANSWER_KEY',
    'WAITING_KEY',
    'Answer',
    'Decision',
    'DeferredCall',
    'DeferredKind',
    'answer_key',
    'answer_of',
    'calls_of',
    'is_answer',
    'pause_metadata',
    'waits',
)

WAITING_KEY = 'stepcore.waiting'
"""Metadata key of the `run_completed` event of a run that paused: its deferred calls, as JSON."""
ANSWER_KEY = 'stepcore.answer'
"""Metadata key of an answer event: the `Answer`, as JSON."""

DeferredKind: TypeAlias = Literal['approval', 'external', 'question']
"""What a deferred call waits for: consent to run it, or its result from outside (a question is an
outside result a person gives)."""

Decision: TypeAlias = Literal['approved', 'denied', 'result', 'failed', 'expired']
"""An answer: the call may run (`approved`, maybe with other arguments), may not (`denied`, with a
message for the model), its result from outside (`result`), its failure outside (`failed`, with a
message), or nobody answered before its deadline (`expired`)."""


@dataclass(frozen=True, slots=True)
class DeferredCall:
    """One tool call a paused run waits on."""

    tool_call_id: str
    tool_name: str
    args: Any
    """The arguments the model gave (a dict, or the raw string when they were not valid JSON)."""
    kind: DeferredKind
    deadline: datetime | None = None
    """When the request expires unanswered (it is then denied); `None`: it waits as long as it takes."""
    metadata: dict[str, Any] = field(default_factory=dict[str, Any])
    """What the tool attached to its deferral (`ApprovalRequired(metadata=...)`, `CallDeferred(metadata=...)`)."""

    def expired(self, now: datetime) -> bool:
        return self.deadline is not None and now >= self.deadline

    def to_json(self) -> dict[str, Any]:
        return {
            'tool_call_id': self.tool_call_id,
            'tool_name': self.tool_name,
            'args': self.args,
            'kind': self.kind,
            'deadline': None if self.deadline is None else self.deadline.isoformat(),
            'metadata': self.metadata,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeferredCall:
        deadline = data.get('deadline')
        return cls(
            tool_call_id=str(data['tool_call_id']),
            tool_name=str(data['tool_name']),
            args=data.get('args'),
            kind=cast(DeferredKind, data.get('kind', 'external')),
            deadline=None if deadline is None else datetime.fromisoformat(deadline),
            metadata=dict(data.get('metadata') or {}),
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer recorded for one deferred call."""

    tool_call_id: str
    decision: Decision
    at: datetime
    """When it was recorded (the answering process's clock, UTC)."""
    by: str | None = None
    """Who answered: a person's id, a bot or a policy name, as the caller gave it; `None` when not given."""
    override_args: dict[str, Any] | None = None
    """For `approved`: the arguments the call runs with instead of the model's."""
    message: str | None = None
    """For `denied`, `failed` and `expired`: what the model is told."""
    result: Any = None
    """For `result`: what the model receives as the call's return."""

    def same_as(self, other: Answer) -> bool:
        """Whether `other` decides the call alike (who gave it and when aside)."""
        return (self.decision, self.override_args, self.message, self.result) == (
            other.decision,
            other.override_args,
            other.message,
            other.result,
        )

    def describe(self) -> str:
        """One line: the decision and what comes with it."""
        if self.decision == 'approved':
            text = 'approved' if self.override_args is None else f'approved with args {self.override_args!r}'
        elif self.decision == 'result':
            text = f'result {self.result!r}'
        else:
            text = f'{self.decision}: {self.message}' if self.message else self.decision
        by = f' by {self.by}' if self.by else ''
        return f'{text}{by} at {self.at:%Y-%m-%d %H:%M:%S}'

    def to_json(self) -> dict[str, Any]:
        return {
            'tool_call_id': self.tool_call_id,
            'decision': self.decision,
            'at': self.at.isoformat(),
            'by': self.by,
            'override_args': self.override_args,
            'message': self.message,
            'result': self.result,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        return cls(
            tool_call_id=str(data['tool_call_id']),
            decision=cast(Decision, data['decision']),
            at=datetime.fromisoformat(data['at']),
            by=data.get('by'),
            override_args=data.get('override_args'),
            message=data.get('message'),
            result=data.get('result'),
        )


def answer_key(tool_call_id: str) -> str:
    """The idempotency key of the answer event for `tool_call_id`: one per call and run."""
    return f'stepcore.answer:{tool_call_id}'


def pause_metadata(calls: list[DeferredCall]) -> dict[str, str]:
    """The metadata that marks a `run_completed` event as the run's pause."""
    return {WAITING_KEY: pydantic_core.to_json([c.to_json() for c in calls]).decode()}


def calls_of(event: StepEvent) -> list[DeferredCall] | None:
    """The deferred calls of a pause event; `None` for any other event."""
    raw = event.metadata.get(WAITING_KEY)
    if raw is None or event.kind is not EventKind.RUN_COMPLETED:
        return None
    return [DeferredCall.from_json(item) for item in json.loads(raw)]


def answer_of(event: StepEvent) -> Answer | None:
    """The answer an event records; `None` for any other event."""
    raw = event.metadata.get(ANSWER_KEY)
    return None if raw is None else Answer.from_json(json.loads(raw))


def is_answer(event: StepEvent) -> bool:
    """Whether `event` records an answer to a deferred call (not a call of the tool)."""
    return ANSWER_KEY in event.metadata


def waits(event: StepEvent) -> bool:
    """Whether `event`, as a run's newest, leaves the run waiting: its pause, or an answer to it."""
    return (event.kind is EventKind.RUN_COMPLETED and WAITING_KEY in event.metadata) or ANSWER_KEY in event.metadata
