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

from stepcore.common.telemetry import approval_expired
from stepcore.ownership.claims import has_leases
from stepcore.recovery.answers import list_waiting, read_waiting
from stepcore.recovery.paused import Waiting, record_answer
from stepcore.recovery.resolution import EXPIRED_BY, expiry_message
from stepcore.store.contract import as_step_store
from stepcore.store.leases import LeaseState
from stepcore.store.models import utcnow
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.step_store import StepStore
from stepcore.store.waiting import Answer, DeferredCall

__all__ = ('Expiry', 'WaitingWatch', 'apply_deadlines', 'due_now', 'ready_to_resume')


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
            if mine:
                approval_expired(paused.run_id, call)
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


@dataclass
class _Seen:
    waiting: Waiting | None
    marker: tuple[int | None, int]
    """The run's newest event seq and its lease epoch when `waiting` was read."""


class WaitingWatch:
    """`due_now` for a loop that asks at every tick: a waiting run is read again (its pause, answers
    and snapshot) only when it is new, when something was appended to it or its lease changed since
    (an answer, a resume), or when one of its deadlines came; otherwise one small read of its newest
    event tells it is as it was."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    async def due_now(self, store: StepStoreProtocol) -> tuple[list[Expiry], list[Waiting]]:
        bound = as_step_store(store)
        if not has_leases(bound):
            return await due_now(bound)
        leases = {lease.run_id: lease for lease in await bound.list_leases([LeaseState.WAITING])}
        for gone in self._seen.keys() - leases.keys():
            del self._seen[gone]
        now = utcnow()
        for run_id, lease in leases.items():
            seen = self._seen.get(run_id)
            overdue = seen is not None and seen.waiting is not None and bool(seen.waiting.overdue(now))
            await self._look(bound, run_id, lease.epoch, again=overdue)
        expiries = await apply_deadlines(bound, [w for w in self._current() if w.overdue(now)])
        for run_id in {expiry.run_id for expiry in expiries}:
            await self._look(bound, run_id, leases[run_id].epoch, again=True)  # with its expiries
        return expiries, sorted(self._current(), key=lambda w: (w.paused_at, w.run_id))

    async def _look(self, store: StepStore, run_id: str, epoch: int, *, again: bool) -> None:
        newest = await store.list_events_page(run_id, newest=True, limit=1)
        marker = (newest[-1].seq if newest else None, epoch)
        seen = self._seen.get(run_id)
        if again or seen is None or seen.marker != marker:
            self._seen[run_id] = _Seen(await read_waiting(store, run_id=run_id), marker)

    def _current(self) -> list[Waiting]:
        return [s.waiting for s in self._seen.values() if s.waiting is not None and s.waiting.resumed_by is None]


async def ready_to_resume(store: StepStoreProtocol) -> list[Waiting]:
    """The waiting runs whose calls are all answered or expired (the expiries recorded first), the
    longest waiting first: nothing is left for a person to do before they resume."""
    _, runs = await due_now(store)
    return [paused for paused in runs if paused.ready()]
