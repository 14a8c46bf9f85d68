"""Reading a run paused on deferred tool calls: what it waits on, and the answers it has.

The format is `stepcore.store.waiting`'s. A run's newest event tells whether it paused (one event
read), so asking costs a run that did not pause next to nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import pydantic_core

from stepcore.store.contract import write_records
from stepcore.store.models import ContinuableSnapshot, EventKind, StepEvent, utcnow
from stepcore.store.step_store import StepStore
from stepcore.store.waiting import ANSWER_KEY, Answer, DeferredCall, answer_key, answer_of, calls_of, waits

__all__ = ('Waiting', 'read_pause', 'record_answer', 'waiting_of')


@dataclass(frozen=True)
class Waiting:
    """A run paused on deferred tool calls: the calls, the answers recorded so far, the paused history."""

    run_id: str
    paused_at: datetime
    step_index: int
    calls: tuple[DeferredCall, ...]
    """The deferred calls, approvals first, in the order the model made them."""
    answers: Mapping[str, Answer]
    """The answer recorded for each answered call, by call id (the first one: answers are recorded once)."""
    snapshot: ContinuableSnapshot | None = field(repr=False)
    """The history the run paused with: resume from it with the answers."""
    pause: StepEvent = field(repr=False, compare=False)
    """The `run_completed` event that records the pause."""
    resumed_by: str | None = None
    """The run that resumed it (answers no longer reach it), as `read_waiting` and `list_waiting` tell."""

    @property
    def agent_name(self) -> str | None:
        return self.pause.agent_name

    @property
    def conversation_id(self) -> str | None:
        return self.pause.conversation_id

    def call(self, tool_call_id: str) -> DeferredCall | None:
        return next((c for c in self.calls if c.tool_call_id == tool_call_id), None)

    def unanswered(self, now: datetime | None = None) -> tuple[DeferredCall, ...]:
        """The calls still waiting for an answer: not answered, and not past their deadline."""
        moment = now or utcnow()
        return tuple(c for c in self.calls if c.tool_call_id not in self.answers and not c.expired(moment))

    def expired(self, now: datetime | None = None) -> tuple[DeferredCall, ...]:
        """The calls nobody answered before their deadline (they are denied on resume): those whose expiry
        is recorded as their answer, and those past their deadline with no answer yet."""
        moment = now or utcnow()
        return tuple(c for c in self.calls if c.tool_call_id in self.overdue(moment) or self._expired_answer(c))

    def overdue(self, now: datetime | None = None) -> tuple[str, ...]:
        """The ids of the calls past their deadline with no answer recorded, not even their expiry."""
        moment = now or utcnow()
        return tuple(c.tool_call_id for c in self.calls if c.tool_call_id not in self.answers and c.expired(moment))

    def _expired_answer(self, call: DeferredCall) -> bool:
        answer = self.answers.get(call.tool_call_id)
        return answer is not None and answer.decision == 'expired'

    def ready(self, now: datetime | None = None) -> bool:
        """Whether every call is answered (or expired) and nothing resumed the run yet."""
        return self.resumed_by is None and not self.unanswered(now)


def waiting_of(run_id: str, events: Sequence[StepEvent], snapshot: ContinuableSnapshot | None) -> Waiting | None:
    """The pause `events` (a run's whole trail) record, with its answers; `None` when the run did not pause."""
    pause: StepEvent | None = None
    calls: list[DeferredCall] = []
    answers: dict[str, Answer] = {}
    for event in events:
        found = calls_of(event)
        if found is not None:  # a run pauses once; a newer pause (a durable replay) replaces the older
            pause, calls, answers = event, found, {}
            continue
        answer = answer_of(event)
        if pause is not None and answer is not None and answer.tool_call_id not in answers:
            answers[answer.tool_call_id] = answer
    if pause is None:
        return None
    return Waiting(
        run_id=run_id,
        paused_at=pause.timestamp,
        step_index=pause.step_index,
        calls=tuple(calls),
        answers=answers,
        snapshot=snapshot,
        pause=pause,
    )


async def read_pause(store: StepStore, run_id: str) -> Waiting | None:
    """The pause of `run_id` with its answers, or `None` when its newest event says it did not pause."""
    newest = await store.list_events_page(run_id, newest=True, limit=1)
    if not newest or not waits(newest[-1]):
        return None
    events = await store.list_events(run_id=run_id)
    snapshot = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    return waiting_of(run_id, events, snapshot)


async def record_answer(store: StepStore, waiting: Waiting, call: DeferredCall, answer: Answer) -> Answer:
    """Record `answer` to `call` unless the call has one: the answer that stands, `answer` or the first.

    One event under the call's answer key: the store applies that key once, so of answers given at
    the same moment in any number of processes exactly one is kept, and each answerer reads back
    which.
    """
    event = StepEvent(
        run_id=waiting.run_id,
        kind=EventKind.TOOL_CALL_COMPLETED,
        step_index=waiting.step_index,
        timestamp=answer.at,
        conversation_id=waiting.pause.conversation_id,
        parent_run_id=waiting.pause.parent_run_id,
        agent_name=waiting.pause.agent_name,
        tool_call_id=call.tool_call_id,
        tool_name=call.tool_name,
        metadata={ANSWER_KEY: pydantic_core.to_json(answer.to_json()).decode()},
        idempotency_key=answer_key(call.tool_call_id),
    )
    await write_records(store, [event])
    kept = waiting_of(waiting.run_id, await store.list_events(run_id=waiting.run_id), None)
    stands = kept.answers.get(call.tool_call_id) if kept is not None else None
    if stands is None:
        raise RuntimeError(
            f'{type(store).__name__} did not keep the answer to tool call {call.tool_call_id!r} of run '
            f'{waiting.run_id!r}: its events do not hold it after it was appended'
        )
    return stands
