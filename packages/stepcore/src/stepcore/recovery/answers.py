"""Durable approvals: answer the deferred tool calls of a paused run, from any process, and resume it once.

A run that ends with `DeferredToolRequests` (a tool with `requires_approval=True`, `ApprovalRequired`,
`CallDeferred`, an external tool) is stored as waiting (`stepcore.store.waiting`). Then:

- `list_waiting` and `read_waiting` tell which runs wait, on which calls, and what was answered;
- `approve_call` (optionally with other arguments), `deny_call` (with a message for the model),
  `answer_call` (the result of a call made outside) and `fail_call` (its failure) record one answer
  per call, with who gave it and when; the first answer stands, and a different one is refused;
- `resume_run` (or `resolve_run` and `Resumption.run`) resumes a run whose calls are all answered,
  in any process: the answers become pydantic-ai's `DeferredToolResults`, the approved calls run,
  and the run carries on as a new run. On a store that keeps leases the run is claimed first, so of
  two resumers exactly one proceeds, and a run once resumed is never resumed again.

A call given a deadline (`StepPersistence(answer_within=...)`) and left unanswered past it is denied
on resume, the model told it expired; an answer after the deadline is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pydantic_core
from pydantic_ai import Agent
from pydantic_ai.run import AgentRunResult

from stepcore.common.telemetry import approval_answered
from stepcore.ownership.claims import has_leases
from stepcore.recovery.chains import resumed_by
from stepcore.recovery.paused import Waiting, read_pause, record_answer
from stepcore.recovery.policies import RecoveryPolicy
from stepcore.recovery.resolution import answer_or_expiry, resolve_run
from stepcore.store.contract import as_step_store
from stepcore.store.leases import DEFAULT_LEASE_TTL, LeaseState, RunCancelledError
from stepcore.store.lifecycle import run_status
from stepcore.store.models import utcnow
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.step_store import StepStore
from stepcore.store.waiting import Answer, DeferredCall, DeferredKind

__all__ = (
    'AnswerConflictError',
    'RequestExpiredError',
    'Waiting',
    'answer_call',
    'approve_call',
    'deny_call',
    'fail_call',
    'list_waiting',
    'read_waiting',
    'resume_run',
)


class AnswerConflictError(ValueError):
    """The call already has a different answer: the first answer stands."""

    def __init__(self, run_id: str, call: DeferredCall, stands: Answer, refused: Answer) -> None:
        self.stands = stands
        self.refused = refused
        super().__init__(
            f'tool call {call.tool_call_id!r} ({call.tool_name}) of run {run_id!r} was already answered: '
            f'{stands.describe()}. An answer is recorded once; yours ({refused.decision}) was not recorded'
        )


class RequestExpiredError(ValueError):
    """The call's deadline passed before the answer came: it was denied as expired."""

    def __init__(self, run_id: str, call: DeferredCall, stands: Answer) -> None:
        self.stands = stands
        super().__init__(
            f'tool call {call.tool_call_id!r} ({call.tool_name}) of run {run_id!r} expired at '
            f'{call.deadline:%Y-%m-%d %H:%M:%S} UTC before it was answered: it is denied on resume, and your '
            'answer was not recorded'
        )


async def read_waiting(store: StepStoreProtocol, *, run_id: str) -> Waiting | None:
    """What `run_id` waits on and the answers it has, with the run that resumed it if any; `None` when
    the run did not pause on deferred tool calls."""
    bound = as_step_store(store)
    paused = await read_pause(bound, run_id)
    if paused is None:
        return None
    return replace(paused, resumed_by=await resumed_by(bound, run_id))


async def list_waiting(store: StepStoreProtocol) -> list[Waiting]:
    """The runs waiting for answers (paused, not resumed yet), the longest waiting first.

    On a store that keeps leases they come from its index of lease states; elsewhere from the runs
    whose events say they wait, less those another run resumed.
    """
    bound = as_step_store(store)
    if has_leases(bound):
        run_ids = [lease.run_id for lease in await bound.list_leases([LeaseState.WAITING])]
    else:
        run_ids = [run.run_id for run in await bound.list_runs(status='waiting')]
    found: list[Waiting] = []
    for run_id in run_ids:
        waiting = await read_waiting(bound, run_id=run_id)
        if waiting is not None and waiting.resumed_by is None:
            found.append(waiting)
    found.sort(key=lambda w: (w.paused_at, w.run_id))
    return found


async def _waiting_call(store: StepStore, run_id: str, tool_call_id: str, verb: str) -> tuple[Waiting, DeferredCall]:
    waiting = await read_waiting(store, run_id=run_id)
    if waiting is None:
        if await store.get_run(run_id=run_id) is None:
            raise LookupError(f'cannot {verb} tool call {tool_call_id!r}: there is no run {run_id!r} in the store')
        status = run_status(await store.list_events_page(run_id, newest=True, limit=1))
        raise ValueError(
            f'cannot {verb} tool call {tool_call_id!r}: run {run_id!r} did not pause on deferred tool calls '
            f'(it is {status}), so nothing waits for an answer'
        )
    if waiting.resumed_by is not None:
        raise ValueError(
            f'cannot {verb} tool call {tool_call_id!r}: run {run_id!r} was resumed by run {waiting.resumed_by!r} '
            'already, with the answers it had; nothing would take this one'
        )
    lease = await store.get_lease(run_id) if has_leases(store) else None
    if lease is not None and lease.cancelled:
        raise RunCancelledError(lease, action=f'given an answer to tool call {tool_call_id!r}')
    call = waiting.call(tool_call_id)
    if call is None:
        calls = ', '.join(f'{c.tool_call_id} ({c.tool_name}, {c.kind})' for c in waiting.calls)
        raise LookupError(f'cannot {verb}: run {run_id!r} waits on no tool call {tool_call_id!r}; it waits on {calls}')
    return waiting, call


def _check_kind(run_id: str, call: DeferredCall, verb: str, kinds: tuple[DeferredKind, ...], instead: str) -> None:
    if call.kind not in kinds:
        raise ValueError(
            f'cannot {verb} tool call {call.tool_call_id!r} ({call.tool_name}) of run {run_id!r}: it waits for '
            f'{"an approval" if call.kind == "approval" else "a result from outside"}, not for this; use {instead}'
        )


def _json_value(value: Any, *, what: str, run_id: str, call: DeferredCall) -> Any:
    try:
        return pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as error:
        raise ValueError(
            f'{what} for tool call {call.tool_call_id!r} of run {run_id!r} cannot be stored: it is not '
            f'JSON-serializable ({error}); pass plain values (dicts, lists, strings, numbers)'
        ) from None


async def _answer(
    store: StepStoreProtocol, run_id: str, tool_call_id: str, verb: str, make: Callable[[DeferredCall], Answer]
) -> Answer:
    """Record the answer `make` builds for the call, once (see `stepcore.recovery.paused.record_answer`)."""
    bound = as_step_store(store)
    waiting, call = await _waiting_call(bound, run_id, tool_call_id, verb)
    answer = make(call)
    stands = await answer_or_expiry(bound, waiting, call)
    if stands is None:
        stands = await record_answer(bound, waiting, call, answer)
    if stands.decision == 'expired' and answer.decision != 'expired':
        raise RequestExpiredError(run_id, call, stands)
    if not stands.same_as(answer):
        raise AnswerConflictError(run_id, call, stands, answer)
    if stands.at == answer.at:  # recorded now, not an earlier answer given again
        approval_answered(answer.decision)
    return stands


async def approve_call(
    store: StepStoreProtocol,
    *,
    run_id: str,
    tool_call_id: str,
    override_args: Mapping[str, Any] | None = None,
    by: str | None = None,
) -> Answer:
    """Approve a deferred call that needs approval: it runs when the run resumes, with `override_args`
    instead of the model's arguments when given.

    Returns the answer that stands: this one, or the same answer given before (answering twice alike
    is harmless). Raises `AnswerConflictError` when the call has a different answer, `RequestExpiredError`
    past its deadline, `ValueError` when the run did not pause, was resumed already or the call waits for
    a result instead, `LookupError` for an unknown run or call. `by` records who approved (pydantic-ai
    does not check it: authorize the person before you record them).
    """

    def make(call: DeferredCall) -> Answer:
        _check_kind(run_id, call, 'approve', ('approval',), 'answer_call or fail_call')
        args: dict[str, Any] | None = None
        if override_args is not None:
            if not isinstance(override_args, Mapping) or not all(isinstance(k, str) for k in override_args):  # pyright: ignore[reportUnnecessaryIsInstance]
                raise ValueError(
                    f'override_args for tool call {tool_call_id!r} of run {run_id!r} must map argument names to '
                    f'values; got {override_args!r}'
                )
            args = _json_value(dict(override_args), what='override_args', run_id=run_id, call=call)
        return Answer(tool_call_id, 'approved', at=utcnow(), by=by, override_args=args)

    return await _answer(store, run_id, tool_call_id, 'approve', make)


async def deny_call(
    store: StepStoreProtocol, *, run_id: str, tool_call_id: str, message: str | None = None, by: str | None = None
) -> Answer:
    """Deny a deferred call that needs approval: it does not run, and the model receives `message`
    (pydantic-ai's default denial message when not given). Returns and raises as `approve_call`."""

    def make(call: DeferredCall) -> Answer:
        _check_kind(run_id, call, 'deny', ('approval',), 'fail_call')
        return Answer(tool_call_id, 'denied', at=utcnow(), by=by, message=message)

    return await _answer(store, run_id, tool_call_id, 'deny', make)


async def answer_call(
    store: StepStoreProtocol, *, run_id: str, tool_call_id: str, result: Any, by: str | None = None
) -> Answer:
    """Give the result of a deferred call made outside the agent (an external tool, `CallDeferred`, a
    question): the model receives `result` (JSON-serializable) as the call's return. Returns and raises
    as `approve_call`."""

    def make(call: DeferredCall) -> Answer:
        _check_kind(run_id, call, 'answer', ('external', 'question'), 'approve_call or deny_call')
        value = _json_value(result, what='the result', run_id=run_id, call=call)
        return Answer(tool_call_id, 'result', at=utcnow(), by=by, result=value)

    return await _answer(store, run_id, tool_call_id, 'answer', make)


async def fail_call(
    store: StepStoreProtocol, *, run_id: str, tool_call_id: str, message: str, by: str | None = None
) -> Answer:
    """Report that a deferred call made outside the agent failed: the model receives `message` as a
    failed tool result (pydantic-ai's `ToolFailed`). Returns and raises as `approve_call`."""

    def make(call: DeferredCall) -> Answer:
        _check_kind(run_id, call, 'fail', ('external', 'question'), 'deny_call')
        return Answer(tool_call_id, 'failed', at=utcnow(), by=by, message=message)

    return await _answer(store, run_id, tool_call_id, 'fail', make)


async def resume_run(
    store: StepStoreProtocol,
    *,
    run_id: str,
    agent: Agent[Any, Any],
    policies: Mapping[str, RecoveryPolicy] | None = None,
    force: bool = False,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    **run_options: Any,
) -> AgentRunResult[Any]:
    """Resume `run_id` with `agent`: `resolve_run(...)` then `Resumption.run(agent, **run_options)`.

    For a run paused on deferred tool calls the answers are handed to the new run (a call still
    unanswered raises `RuntimeError` naming it); for a run a crash cut short its calls are settled by
    their tools' policies first. On a store that keeps leases of two resumers exactly one proceeds: the
    other gets `RunOwnedError` (the first holds it) or `RunClaimedError` (it was resumed already).
    """
    resumption = await resolve_run(
        store, run_id=run_id, agent=agent, policies=policies, force=force, lease_ttl=lease_ttl
    )
    return await resumption.run(agent, **run_options)
