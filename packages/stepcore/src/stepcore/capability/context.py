"""Which `StepPersistence` run and tool call enclose the code running in this context."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic_ai.tools import RunContext

from stepcore.ownership.claims import Claim
from stepcore.store.leases import Fence, FencingToken, RunFencedError, current_fences, fencing
from stepcore.store.protocols import StepStoreProtocol

__all__ = (
    'JOB_KEY',
    'RESUMES_KEY',
    'VERSION_KEY',
    'ActiveToolCall',
    'JobLink',
    'ResumptionLink',
    'ToolEffectAnnotator',
    'active_run_id',
    'active_tool_call',
    'check_fencing_token',
    'fencing_token',
    'inside_run',
    'inside_tool_call',
    'job_leased',
    'note_tool_attempt',
    'resuming',
    'settling_under',
    'starting_job',
    'take_job',
    'take_resumption',
)

RESUMES_KEY = 'stepcore.resumes'
"""Run-record metadata key of a run started by `Resumption.run`: the run it resumes."""

JOB_KEY = 'stepcore.job'
"""Run-record metadata key: the job the run belongs to (`stepcore.start_job`), on every run of its chain."""

VERSION_KEY = 'stepcore.version'
"""Run-record metadata key: the application version the run's chain was started by
(`StepPersistence(version=...)`)."""


class ToolEffectAnnotator(Protocol):
    """What `annotate_tool_effect` calls: the capability executing the tool call."""

    async def annotate(
        self,
        ctx: RunContext[Any],
        store: StepStoreProtocol,
        tool_call_id: str,
        *,
        idempotency_key: str | None,
        effect_summary: str | None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class ActiveToolCall:
    """The tool call a `StepPersistence` is currently executing (see `annotate_tool_effect`)."""

    capability: ToolEffectAnnotator
    """The `StepPersistence` (its per-run copy) that wraps the call."""
    run_id: str
    tool_call_id: str
    attempts: list[str | None] = field(default_factory=list[str | None])
    """How each run of the tool itself ended while this call was executed (more than one when a
    capability inside `StepPersistence` runs it again): the `repr` of the exception it raised, or
    `None` when it returned; whatever the capabilities around it made of that afterwards (see
    `note_tool_attempt`)."""


_ACTIVE_RUN_ID: ContextVar[str | None] = ContextVar('stepcore_active_run_id', default=None)
"""The run id of the innermost enclosing `StepPersistence.wrap_run`, read by delegates as their parent."""

_ACTIVE_TOOL_CALL: ContextVar[ActiveToolCall | None] = ContextVar('stepcore_active_tool_call', default=None)

_TOKEN_RUN: ContextVar[str | None] = ContextVar('stepcore_token_run', default=None)
"""The run whose fence `fencing_token` gives: the innermost enclosing run, or the run whose calls recovery
settles under its claim (`settling_under`)."""


def active_tool_call() -> ActiveToolCall | None:
    """The tool call being executed under a `StepPersistence` in this context, if any."""
    return _ACTIVE_TOOL_CALL.get()


def active_run_id() -> str | None:
    """The run id of the innermost `StepPersistence` run in this context, if any."""
    return _ACTIVE_RUN_ID.get()


def _token_fence() -> Fence | None:
    """The fence whose token `fencing_token` gives in this context (see `_TOKEN_RUN`)."""
    run_id = _TOKEN_RUN.get()
    return current_fences().get(run_id) if run_id is not None else None


def fencing_token() -> FencingToken | None:
    """The fencing token of the run this code runs in (a tool's, say): its run id, the epoch of its
    lease and the first run of its chain of resumptions; `None` outside a run or when the run holds
    no lease (its store keeps none, `lease_ttl=None`, or a durable engine owns the run).

    Inside a settlement (a reconcile function called by `resolve_run`, a settlement by hand) it is the
    claimer's token: the epoch recovery's claim raised the run to. A reconcile function hands it
    downstream before it looks, so a zombie of the old owner is refused there from then on.

    Hand it to a system outside the store that remembers the highest epoch it saw per `origin` and
    refuses a lower one: a zombie of the run (a process paused past its lease and taken over) is then
    refused there too. See docs/fleet.md.
    """
    fence = _token_fence()
    return fence.token if fence is not None else None


async def check_fencing_token() -> FencingToken | None:
    """Ask the store whether the run this code runs in still holds its lease at its fencing token's
    epoch: the token when it does, `RunFencedError` when it does not (cancelled, or taken over by
    another process: the error says which), `None` where `fencing_token()` is `None`.

    A downstream system that checks tokens refuses an old epoch only once it has seen a newer one; a
    tool about to do something slow or irreversible can ask first, and stop at once if its run was
    cancelled or taken over meanwhile. It is one read of the lease, not a guarantee for the moment
    after it: keep handing the token downstream.
    """
    fence = _token_fence()
    if fence is None or fence.epoch is None:
        return None
    if fence.lost is not None:
        raise RunFencedError(fence.run_id, fence.epoch, fence.lost)
    if fence.store is not None:
        lease = await fence.store.get_lease(fence.run_id)
        if lease is None or lease.epoch != fence.epoch:
            raise RunFencedError(fence.run_id, fence.epoch, lease)
    return fence.token


@contextmanager
def inside_run(run_id: str) -> Iterator[None]:
    """Make `run_id` the active run (the parent of runs started inside, such as delegates)."""
    token = _ACTIVE_RUN_ID.set(run_id)
    named = _TOKEN_RUN.set(run_id)
    try:
        yield
    finally:
        _TOKEN_RUN.reset(named)
        _ACTIVE_RUN_ID.reset(token)


@contextmanager
def settling_under(fence: Fence) -> Iterator[Fence]:
    """Settle calls of `fence.run_id` under recovery's claim: its writes are fenced by `fence`, and
    `fencing_token()` gives the claimer's token (to reconcile functions, say)."""
    with fencing(fence):
        named = _TOKEN_RUN.set(fence.run_id)
        try:
            yield fence
        finally:
            _TOKEN_RUN.reset(named)


def note_tool_attempt(tool_call_id: str | None, error: BaseException | None) -> None:
    """Remember that the tool of call `tool_call_id` raised `error` (or returned: `None`), for the
    `StepPersistence` executing that call in this context; nothing happens outside such a call."""
    call = _ACTIVE_TOOL_CALL.get()
    if call is not None and call.tool_call_id == tool_call_id:
        call.attempts.append(None if error is None else repr(error))


@contextmanager
def inside_tool_call(call: ActiveToolCall) -> Iterator[None]:
    """Make `call` the active tool call while the tool body runs."""
    token = _ACTIVE_TOOL_CALL.set(call)
    try:
        yield
    finally:
        _ACTIVE_TOOL_CALL.reset(token)


@dataclass
class ResumptionLink:
    """The run a resumption started in this context resumes, and recovery's claim on it, until a
    `StepPersistence` run takes them (`take_resumption`)."""

    run_id: str
    claim: Claim | None = None
    claimed: bool = False


_RESUMING: ContextVar[ResumptionLink | None] = ContextVar('stepcore_resuming', default=None)


@contextmanager
def resuming(run_id: str, claim: Claim | None = None) -> Iterator[ResumptionLink]:
    """While the block runs, a `StepPersistence` run that starts resumes `run_id` (and takes `claim`
    over); the link says afterwards whether one did."""
    link = ResumptionLink(run_id, claim)
    token = _RESUMING.set(link)
    try:
        yield link
    finally:
        _RESUMING.reset(token)


def take_resumption() -> tuple[str, Claim | None] | None:
    """The run the starting run resumes, and recovery's claim on it, once: the first
    `StepPersistence` run to ask takes them (and hands the claimed run over to itself)."""
    link = _RESUMING.get()
    if link is None or link.claimed:
        return None
    link.claimed = True
    return link.run_id, link.claim


@dataclass
class JobLink:
    """The job a run started in this context is to be, until a `StepPersistence` run takes it."""

    job_id: str
    taken: bool = False
    leased: bool = False
    """Whether the run that took it also took the job's lease: the job started here."""


_JOB: ContextVar[JobLink | None] = ContextVar('stepcore_job', default=None)


@contextmanager
def starting_job(link: JobLink) -> Iterator[JobLink]:
    """While the block runs, the first `StepPersistence` run to start is job `link.job_id` (its run id)."""
    token = _JOB.set(link)
    try:
        yield link
    finally:
        _JOB.reset(token)


def job_leased(job_id: str) -> None:
    """The run that took job `job_id` took its lease too (see `JobLink.leased`)."""
    link = _JOB.get()
    if link is not None and link.taken and link.job_id == job_id:
        link.leased = True


def take_job() -> str | None:
    """The job id the starting run is to run under, once: the first `StepPersistence` run to ask takes
    it (a delegate started later inside it does not)."""
    link = _JOB.get()
    if link is None or link.taken:
        return None
    link.taken = True
    return link.job_id
