"""Timers: approval deadlines applied without waiting for a person, and answered runs resumed by themselves.

A deferred call given a deadline (`StepPersistence(answer_within=...)`) expires when nobody answered
it in time; until now the expiry was recorded only when someone answered or resumed the run.
`apply_deadlines` records it as soon as it is due, for every waiting run: the call's answer becomes
its expiry (by `stepcore (deadline)`, under the once-only answer key, so an answer given at the same
moment either stands or is refused, never both). The recovery loop calls it at every tick, and, with
`resume_answered=True`, resumes every waiting run whose calls are all answered or expired, so no
person has to press resume (`ready_to_resume` lists them).
"""

from __future__ import annotations

from dataclasses import dataclass

from stepcore.recovery.answers import list_waiting
from stepcore.recovery.paused import Waiting, record_answer
from stepcore.recovery.resolution import EXPIRED_BY, expiry_message
from stepcore.store.contract import as_step_store
from stepcore.store.models import utcnow
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.waiting import Answer, DeferredCall

__all__ = ('Expiry', 'apply_deadlines', 'due_now', 'ready_to_resume')


@dataclass(frozen=True)
class Expiry:
    """A deferred call whose deadline passed: the answer that stands for it now."""

    run_id: str
    call: DeferredCall
    answer: Answer
    """Its expiry, or an answer a person gave at the very moment of the deadline (the first stands)."""
    recorded: bool
    """Whether this call recorded the expiry that stands (of several workers applying the same
    deadline at once, one did)."""


async def apply_deadlines(store: StepStoreProtocol, waiting: list[Waiting] | None = None) -> list[Expiry]:
    """Record the expiry of every unanswered deferred call past its deadline in the waiting runs
    (`waiting`, or every run `list_waiting` finds); returns what it recorded."""
    bound = as_step_store(store)
    runs = await list_waiting(bound) if waiting is None else waiting
    now = utcnow()
    found: list[Expiry] = []
    for paused in runs:
        overdue = paused.overdue(now)
        for call in (c for c in paused.calls if c.tool_call_id in overdue):
            expiry = Answer(call.tool_call_id, 'expired', at=now, by=EXPIRED_BY, message=expiry_message(call))
            stands = await record_answer(bound, paused, call, expiry)
            mine = stands.decision == 'expired' and stands.at == expiry.at
            found.append(Expiry(paused.run_id, call, stands, mine))
    return found


async def due_now(store: StepStoreProtocol) -> tuple[list[Expiry], list[Waiting]]:
    """Apply the deadlines of every waiting run (`apply_deadlines`): what was recorded, and the waiting
    runs as they stand afterwards (read again only when an expiry was recorded)."""
    bound = as_step_store(store)
    runs = await list_waiting(bound)
    expiries = await apply_deadlines(bound, runs)
    if expiries:
        runs = await list_waiting(bound)
    return expiries, runs


async def ready_to_resume(store: StepStoreProtocol) -> list[Waiting]:
    """The waiting runs whose calls are all answered or expired (the expiries recorded first), the
    longest waiting first: nothing is left for a person to do before they resume."""
    _, runs = await due_now(store)
    return [paused for paused in runs if paused.ready()]
