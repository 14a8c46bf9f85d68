"""`resolve_run`: settle the tool calls a crash cut short, by each tool's recovery policy, and resume.

After a kill the newest complete snapshot of a run ends before the tool cycle that was running:
the model's response with its calls reached no complete snapshot, and the ledger holds those calls
as `started` (or `failed`, for one whose retry prompt never reached a snapshot). Continuing from the
snapshot would ask the model again, and it would call the tools again. `resolve_run` instead:

1. follows the run's continuations to the newest (a run that was resumed is never resumed again:
   `stepcore.recovery.chains`), and, where the store keeps leases, claims that run: one
   compare-and-set on its lease that refuses a run a live owner holds and raises the epoch, so of
   concurrent resolvers exactly one proceeds and a zombie of the old owner is fenced;
2. takes the newest complete snapshot (back through the runs it resumes, or the start point a run
   killed before its first settled step kept) and the calls of the cut cycle (the ledger entries of
   the newest step that the snapshot does not hold: `stepcore.recovery.cut`);
3. settles each by its tool's policy (`stepcore.recovery.policies`): `'rerun'` runs it again, a reconcile
   function asks the outside world, `'ask'` leaves it to a person (`supply_result`, `mark_checked`,
   `rerun_call`: `stepcore.recovery.by_hand`);
4. records each settlement in the ledger (`completed`, the effect summary saying how) with a
   `tool_call_completed` event whose metadata carries how and the result, under its claim's fence;
5. returns a `Resumption`: the history (the snapshot plus the model's response, taken from an
   interrupted snapshot when `capture_frontier=True` saved it, else rebuilt from the ledger),
   pydantic-ai `DeferredToolResults` (results for settled calls, approvals for calls to run), and the
   claim, which `Resumption.run` hands to the new run. A run left with calls for a person is let go as
   `pending`; a finished one as it was.

`Resumption.run(agent)` runs it and tags the new run's record with the run it resumes
(`RESUMES_KEY`); the new run takes its lease one epoch past the claim and marks the run it resumes
as resumed by it. A resumption killed before it saved a complete snapshot got no further than the
cut cycle: `resolve_run` on it follows the tags back to the newest run with a complete snapshot
and reads the ledgers of every run on the way, so a call an abandoned resumption started is settled
by its policy like any cut-short call, never run blindly.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelMessage
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import DeferredToolResults, ToolApproved, ToolDenied

from stepcore.capability.context import resuming
from stepcore.capability.settled import unanswered_tool_calls
from stepcore.common.telemetry import traced_resolution
from stepcore.ownership.claims import Claim
from stepcore.recovery.chains import continuations
from stepcore.recovery.claiming import Ownership, claim_for_recovery, fenced, release_quietly
from stepcore.recovery.cut import CutView, answered_in, cut_view
from stepcore.recovery.ledger import Recorded, SettledBy, record_settlements, run_end_event
from stepcore.recovery.paused import Waiting, record_answer
from stepcore.recovery.policies import Reconciled, RecoveryPolicy, policy_for, reconcile
from stepcore.store.contract import as_step_store, write_records
from stepcore.store.leases import DEFAULT_LEASE_TTL, Lease, LeaseState, RunClaimedError, RunDeadError, with_change
from stepcore.store.models import EventKind, ToolEffectRecord, utcnow
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.step_store import StepStore
from stepcore.store.waiting import Answer, DeferredCall

__all__ = (
    'COMPLETED_ON_RECOVERY_KEY',
    'EXPIRED_BY',
    'Resumption',
    'RunAbandonedError',
    'Settlement',
    'expiry_message',
    'resolve_run',
)

logger = logging.getLogger('stepcore.recovery')

_FENCE_ATTEMPTS = 5


class RunAbandonedError(LookupError):
    """The run was ended as `abandoned` by the recovery that raised this: a resumption that was stopped
    before it took the run it resumes over, so there is nothing of its own to recover."""

    def __init__(self, run_id: str, resumes: str) -> None:
        super().__init__(
            f'run {run_id!r} is an abandoned resumption of run {resumes!r}: it was stopped before it took '
            f'{resumes!r} over, and ran nothing of it. Recover {resumes!r} instead (its own lease says how it stands)'
        )
        self.run_id = run_id
        self.resumes = resumes


@dataclass(frozen=True)
class Settlement:
    """One call of the cut cycle and how it was settled."""

    tool_call_id: str
    tool_name: str
    args: Any
    how: SettledBy
    result: Any = None
    """The result the call gets (`None` for a call that runs again)."""


@dataclass(frozen=True)
class Resumption:
    """What resuming a run takes: the history, the results to hand pydantic-ai, and what is left to settle."""

    run_id: str
    """The run `run` resumes: the one asked about, or its newest continuation (`followed`)."""
    message_history: list[ModelMessage]
    deferred_tool_results: DeferredToolResults | None
    """Results and approvals for the calls of the cut cycle; `None` when the history has no open call."""
    settled: tuple[Settlement, ...] = ()
    """The calls settled, in the order the model made them."""
    pending: tuple[ToolEffectRecord, ...] = ()
    """Calls under `'ask'` nobody settled yet: `supply_result`, `mark_checked` or `rerun_call` them,
    then resolve again."""
    stale: tuple[ToolEffectRecord, ...] = ()
    """Unresolved entries of older steps, whose calls are in no history the run can continue from
    (the model moved on without their results): check them by hand; they do not hold the run back."""
    finished: bool = False
    """The run (its newest continuation) had already ended with a final response: nothing to resume."""
    snapshot_run_id: str = ''
    """The run whose complete snapshot the history starts from: `run_id` itself, or, when `run_id` is a
    resumption killed before it saved one, the newest run it (through its own resumptions) resumes that did."""
    followed: tuple[str, ...] = ()
    """The run asked about and the runs that continue it, up to `run_id` (just `run_id` when it was
    never resumed)."""
    claim: Claim | None = None
    """Recovery's claim on `run_id` (a store that keeps leases), which `run` hands to the new run."""
    ownership: Ownership = 'unchecked'
    claimed: Lease | None = None
    """The run's lease as recovery's claim found it (its owner, and when it expired); `None` without a
    claim, or when the run had no lease."""
    claimed_at: datetime | None = None
    """When recovery's claim on `run_id` was made (`None`: no claim)."""
    from_start: bool = False
    """The history is the start point the run's lease kept: it was killed before its first settled step."""
    waiting: tuple[DeferredCall, ...] = ()
    """Deferred calls of a run that paused still waiting for an answer (`approve_call`, `deny_call`,
    `answer_call`, `fail_call`), then resolve again."""
    answered: tuple[Answer, ...] = ()
    """The answers to the deferred calls of a run that paused, as handed to the resumed run (an
    expired call's denial included)."""

    @property
    def asked(self) -> str:
        """The run `resolve_run` was asked about."""
        return self.followed[0] if self.followed else self.run_id

    @property
    def ready(self) -> bool:
        """Whether the run can be resumed now: every call of the cut cycle is settled, every deferred
        call answered."""
        return not self.pending and not self.waiting and not self.finished

    async def release(self) -> None:
        """Let go of the claim without resuming: the run is claimable again at once (by a fleet's
        recovery loop, or by `resolve_run` here). A claim not run nor released lasts its `lease_ttl`."""
        claim = self.claim
        if claim is not None:
            object.__setattr__(self, 'claim', None)
            await claim.release()

    async def run(self, agent: Agent[Any, Any], **run_options: Any) -> AgentRunResult[Any]:
        """Resume: `agent.run(message_history=..., deferred_tool_results=..., **run_options)`.

        The new run's record carries `RESUMES_KEY` naming this run; the agent's `StepPersistence` takes
        the claim over (the run is then resumed by the new run, and never resumed again). Raises
        `RuntimeError` naming the calls still pending, or when the run had finished; `RunClaimedError`
        (from the run's start) when another worker took the run over since `resolve_run`.
        """
        if self.finished:
            followed = f' (as the newest continuation of {self.asked!r})' if self.asked != self.run_id else ''
            raise RuntimeError(
                f'run {self.run_id!r}{followed} already ended with a final response: there is nothing to resume'
            )
        if self.waiting:
            calls = ', '.join(f'{c.tool_name} ({c.tool_call_id}, {c.kind})' for c in self.waiting)
            raise RuntimeError(
                f'run {self.run_id!r} waits for answers to deferred tool calls: {calls}. Answer each with '
                'approve_call, deny_call, answer_call or fail_call (stepcore answer RUN CALL ...), then resume again'
            )
        if self.pending:
            calls = ', '.join(f'{e.tool_name} ({e.tool_call_id}) args={e.args!r}' for e in self.pending)
            raise RuntimeError(
                f'run {self.run_id!r} has tool calls nobody settled yet: {calls}. Check each outside the agent, '
                'then supply_result(...), mark_checked(...) or rerun_call(...) it (stepcore recover '
                '--supply/--mark-checked/--rerun) and call resolve_run again'
            )
        with resuming(self.run_id, self.claim) as link:
            try:
                return await agent.run(
                    message_history=self.message_history,
                    deferred_tool_results=self.deferred_tool_results,
                    **run_options,
                )
            finally:
                if self.claim is not None and not link.claimed:
                    # no StepPersistence run took the claim over: the run was resumed outside stepcore's sight
                    logger.warning(
                        'run %r was resumed by an agent without StepPersistence on its store: it is left claimable',
                        self.run_id,
                    )
                    await self.claim.release()


@traced_resolution
async def resolve_run(
    store: StepStoreProtocol,
    *,
    run_id: str,
    agent: Agent[Any, Any] | None = None,
    policies: Mapping[str, RecoveryPolicy] | None = None,
    force: bool = False,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    max_recovery_attempts: int | None = None,
) -> Resumption:
    """Settle the calls a crash cut short in `run_id` (or its newest continuation) by their tools'
    policies, and say how to resume.

    With `max_recovery_attempts` (the recovery loop passes its own), a run whose chain already had
    that many resumptions die (`Lease.died`) is not resumed again: its lease is set `dead` and
    `RunDeadError` says so, listing each attempt (`retry_run` gives it another chance).

    A run that was resumed is followed to its newest continuation: a finished one gives
    `finished=True`, a crashed one is resolved. On a store that keeps leases the run is claimed first:
    a run a live owner holds is refused with `RunOwnedError` naming the owner (host, pid) and when its
    lease expires, unless `force=True` (for a person who knows the owner is gone); a run another
    resolver claimed first is refused with `RunClaimedError`. The claim lasts `lease_ttl` seconds and
    goes with the `Resumption` to `Resumption.run`.

    Policies come from `policies` (tool name to policy), then from the agent's tools
    (`recovery_policy`), else `'ask'`. Settlements are recorded in the run's ledger as they are
    made; calling it again settles nothing twice (a re-run call is re-run again, a reconciled call
    is asked about again, answers a person gave are reused). Raises `LookupError` when there is
    nothing to resume from.
    """
    bound = as_step_store(store)
    followed = await continuations(bound, run_id)
    target = followed[-1]
    claim, ownership = await claim_for_recovery(bound, target, force=force, ttl=lease_ttl, action='resolve_run')
    if claim is not None:
        await _refuse_abandoned(claim)
        previous = claim.previous
        if max_recovery_attempts is not None and previous is not None and previous.state is LeaseState.DEAD:
            # another worker set it dead after this one listed it: recovery leaves it so
            await claim.restore()
            raise RunClaimedError(target, replace(previous, owner=None), action='resumed automatically')
        if (
            max_recovery_attempts is not None
            and len(claim.lease.died) >= max_recovery_attempts
            and not (await _finished(bound, target))
        ):  # a run whose owner died after it wrote its end finished: it is not set dead
            dead = await claim.release(
                state=LeaseState.DEAD,
                outcome='dead',
                note=f'{len(claim.lease.died)} resumptions died; not resumed automatically any more',
            )
            raise RunDeadError(dead)
    try:
        view = await cut_view(bound, target)
        with fenced(claim):
            resumption = await _resolve(bound, view, agent, policies)
    except BaseException:
        await release_quietly(claim)
        raise
    resumption = replace(
        resumption,
        followed=tuple(followed),
        claim=claim,
        ownership=ownership,
        claimed=claim.previous if claim is not None else None,
        claimed_at=claim.lease.since if claim is not None else None,
    )
    if claim is not None and not resumption.ready:
        if resumption.finished:
            previous = claim.previous
            if previous is not None and previous.state is LeaseState.ENDED:
                await claim.restore()
            else:
                await claim.release(state=LeaseState.ENDED, outcome='completed')
        elif resumption.waiting:
            calls = ', '.join(f'{c.tool_name} ({c.tool_call_id})' for c in resumption.waiting)
            await claim.release(state=LeaseState.WAITING, note=f'waiting for answers: {calls}')
        else:
            calls = ', '.join(f'{e.tool_name} ({e.tool_call_id})' for e in resumption.pending)
            await claim.release(state=LeaseState.PENDING, note=f'settle by hand: {calls}')
        resumption = replace(resumption, claim=None)
    return resumption


async def _refuse_abandoned(claim: Claim) -> None:
    """A resumption that took its lease and was killed before the run it resumes named it as its
    continuation never took that run over: the run it meant to resume is still the one to recover.
    Its lease is ended as `abandoned` and `LookupError` says where to go instead."""
    resumes = claim.lease.resumes
    if resumes is None:
        return
    store = claim.store
    meant = await store.get_lease(resumes)
    for _ in range(_FENCE_ATTEMPTS):
        if meant is None or meant.resumed_by == claim.run_id:
            return  # its hand-over completed (or the run it resumes kept no lease): it is the continuation
        if meant.state is not LeaseState.RUNNING:
            break  # the run it meant to resume was resumed by another run, or ended: its hand-over cannot complete
        # The hand-over may still be on its way (its process paused between taking its own lease and
        # marking the run it resumes): the run's epoch is raised, so that it never completes, and the run
        # is left claimable at once.
        bumped = replace(meant, epoch=meant.epoch + 1, since=utcnow())
        bumped = with_change(meant, bumped, detail=f'run {claim.run_id!r} never completed taking it over')
        swapped, now = await store.swap_lease(bumped, expect=meant.epoch, ttl=0.0)
        if swapped:
            break
        meant = now
    await claim.release(state=LeaseState.ENDED, outcome='abandoned', note=f'it never took over run {resumes!r}')
    raise RunAbandonedError(claim.run_id, resumes)


@dataclass
class _Settling:
    """The calls of a cut cycle as they are settled: what pydantic-ai gets, and what is recorded."""

    view: CutView
    results: DeferredToolResults = field(default_factory=DeferredToolResults)
    settlements: list[Settlement] = field(default_factory=list[Settlement])
    newly: list[tuple[ToolEffectRecord, SettledBy, Any]] = field(
        default_factory=list[tuple[ToolEffectRecord, SettledBy, Any]]
    )
    """Settlements to record (those not recorded already)."""
    pending: list[ToolEffectRecord] = field(default_factory=list[ToolEffectRecord])

    async def cut_short(
        self, same_call: Sequence[ToolEffectRecord], policy: RecoveryPolicy, *, rerun: bool | ToolApproved
    ) -> None:
        """Settle a call a crash cut short (its entries in the chain, newest first) by `policy`; a call
        to run again is approved with `rerun`."""
        entry = same_call[0]
        how, result = await _settle(entry, self.view.recorded(entry.tool_call_id), policy)
        if how is None:
            self.pending.append(entry)
            return
        if how == 'rerun':
            self.results.approvals[entry.tool_call_id] = rerun
        else:
            self.results.calls[entry.tool_call_id] = result
        self.settlements.append(Settlement(entry.tool_call_id, entry.tool_name, entry.args, how, result))
        own = next(led for led in self.view.ledgers if led.run_id == entry.run_id).recorded.get(entry.tool_call_id)
        if own is None or own.how != how or how == 'reconciled':
            self.newly.append((entry, how, result))
        # What older runs of the chain left unresolved for the same call is settled with it.
        self.newly.extend((older, how, result) for older in same_call[1:] if older.unresolved)


async def _resolve(
    store: StepStore, view: CutView, agent: Agent[Any, Any] | None, policies: Mapping[str, RecoveryPolicy] | None
) -> Resumption:
    base = view.base
    in_base = answered_in(base, view.paused)
    # Calls whose results the snapshot already holds, left `started` by a store without batched writes.
    answered = [e for e in view.ledgers[-1].by_id.values() if e.unresolved and e.tool_call_id in in_base]
    await record_settlements(store, [(e, 'snapshot', None) for e in answered])

    if view.paused is not None:
        return await _resolve_paused(store, view, view.paused, agent, policies)
    response = view.response
    if response is None:
        if view.finished:
            await _record_completion(store, view)
        return Resumption(
            run_id=view.run_id,
            message_history=list(base),
            deferred_tool_results=None,
            stale=view.stale,
            finished=view.finished,
            snapshot_run_id=view.chain[-1],
            from_start=view.from_start,
        )

    lookup = policy_for(agent, policies)
    settling = _Settling(view)
    for call in unanswered_tool_calls([response]):
        same_call = view.cycle.get(call.tool_call_id)
        if same_call is None:  # never started: nothing happened, it runs
            settling.results.approvals[call.tool_call_id] = True
            continue
        await settling.cut_short(same_call, lookup(same_call[0].tool_name), rerun=True)
    await record_settlements(store, settling.newly)
    return Resumption(
        run_id=view.run_id,
        message_history=[*base, response],
        deferred_tool_results=settling.results,
        settled=tuple(settling.settlements),
        pending=tuple(settling.pending),
        stale=view.stale,
        snapshot_run_id=view.chain[-1],
        from_start=view.from_start,
    )


EXPIRED_BY = 'stepcore (deadline)'
"""Who an expired deferred call's denial is recorded as given by."""


def expiry_message(call: DeferredCall) -> str:
    """What the model is told of a deferred call nobody answered before its deadline."""
    assert call.deadline is not None
    return (
        f'The request to run {call.tool_name} was not answered before its deadline '
        f'({call.deadline:%Y-%m-%d %H:%M:%S} UTC) and expired: the call was not run.'
    )


async def answer_or_expiry(store: StepStore, paused: Waiting, call: DeferredCall) -> Answer | None:
    """The answer to `call`; for a call past its deadline with none, its expiry, recorded once (an
    answer given at the same moment may stand instead); `None` while it waits."""
    answer = paused.answers.get(call.tool_call_id)
    now = utcnow()
    if answer is not None or not call.expired(now):
        return answer
    expiry = Answer(call.tool_call_id, 'expired', at=now, by=EXPIRED_BY, message=expiry_message(call))
    return await record_answer(store, paused, call, expiry)


def _approval(answer: Answer) -> bool | ToolApproved:
    """An approval as pydantic-ai takes it: with the arguments it gave, when it gave any."""
    return ToolApproved(override_args=answer.override_args) if answer.override_args else True


def _hand_over_answer(results: DeferredToolResults, call: DeferredCall, answer: Answer) -> None:
    """Put `answer` in `results` as pydantic-ai takes it."""
    call_id = call.tool_call_id
    if answer.decision == 'approved':
        results.approvals[call_id] = _approval(answer)
    elif answer.decision == 'denied':
        results.approvals[call_id] = ToolDenied(answer.message) if answer.message else ToolDenied()
    elif answer.decision == 'result':
        results.calls[call_id] = answer.result
    elif call.kind == 'approval':  # expired
        results.approvals[call_id] = ToolDenied(answer.message or 'The tool call was denied.')
    else:  # failed outside, or expired
        results.calls[call_id] = ToolFailed(answer.message or 'The tool call failed.')


async def _resolve_paused(
    store: StepStore,
    view: CutView,
    paused: Waiting,
    agent: Agent[Any, Any] | None,
    policies: Mapping[str, RecoveryPolicy] | None,
) -> Resumption:
    """Resume a run that paused on deferred tool calls, or a resumption of it killed before it saved a
    complete snapshot: the paused history, and for each deferred call its answer; an approved call
    a resumption started is settled by its tool's policy like any cut-short call."""
    lookup = policy_for(agent, policies)
    settling = _Settling(view)
    results = settling.results
    waiting: list[DeferredCall] = []
    answered: list[Answer] = []
    resumptions = set(view.chain[:-1])
    for open_call in unanswered_tool_calls(view.base):
        call = paused.call(open_call.tool_call_id) or DeferredCall(
            open_call.tool_call_id, open_call.tool_name, open_call.args, 'external'
        )
        answer = await answer_or_expiry(store, paused, call)
        if answer is None:
            waiting.append(call)
            continue
        answered.append(answer)
        started = [e for e in view.cycle.get(call.tool_call_id, ()) if e.run_id in resumptions]
        if answer.decision != 'approved' or not started:
            _hand_over_answer(results, call, answer)
            continue
        # approved, and a resumption ran it: cut short like any call, run again as approved
        await settling.cut_short(started, lookup(started[0].tool_name), rerun=_approval(answer))
    await record_settlements(store, settling.newly)
    return Resumption(
        run_id=view.run_id,
        message_history=list(view.base),
        deferred_tool_results=results if results.approvals or results.calls else None,
        settled=tuple(settling.settlements),
        pending=tuple(settling.pending),
        stale=view.stale,
        snapshot_run_id=view.chain[-1],
        waiting=tuple(waiting),
        answered=tuple(answered),
    )


COMPLETED_ON_RECOVERY_KEY = 'stepcore.completed_on_recovery'
"""Metadata key of a `run_completed` event recovery appended for a run that saved its final answer and
was killed before it recorded its completion."""


async def _record_completion(store: StepStore, view: CutView) -> None:
    """A run killed after it saved its final answer and before its `run_completed` event: the event is
    appended now (marked `COMPLETED_ON_RECOVERY_KEY`), so the run reads as completed."""
    run_id = view.chain[0]
    if view.chain[-1] != run_id:
        return  # the final answer is another run's: this one never reached it
    newest = await store.list_events_page(run_id, newest=True, limit=1)
    if newest and newest[-1].kind in (EventKind.RUN_COMPLETED, EventKind.RUN_FAILED):
        return
    event = await run_end_event(
        store,
        run_id,
        EventKind.RUN_COMPLETED,
        metadata={COMPLETED_ON_RECOVERY_KEY: '1'},
        idempotency_key='run_completed:recovered',
    )
    await write_records(store, [event])


async def _settle(
    entry: ToolEffectRecord, recorded: Recorded | None, policy: RecoveryPolicy
) -> tuple[SettledBy | None, Any]:
    """How `entry` is settled and with what result; `(None, None)` while nobody settled an `'ask'` call."""
    if recorded is not None and (recorded.how in ('supplied', 'checked') or recorded.by_hand):
        return recorded.how, recorded.result  # a person's answer stands
    if policy == 'rerun':
        return 'rerun', None
    if policy == 'ask':  # only a person settles it: an earlier re-run or reconciliation is no answer now
        return None, None
    answer: Reconciled | None = await reconcile(policy, entry)
    if answer is None:
        return 'rerun', None
    return 'reconciled', answer.result


async def _finished(store: StepStore, run_id: str) -> bool:
    """Whether the run's records say it finished (a final response stored), whatever its lease says."""
    try:
        return (await cut_view(store, run_id)).finished
    except LookupError:
        return False
