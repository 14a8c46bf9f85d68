"""Resuming orphaned runs: the recovery loop any worker of a fleet runs.

Every worker sharing a store may run `recover_orphans` (one pass) or `run_recovery_loop` (continuous,
until stopped). For each orphan (`stepcore.ownership.list_orphans`: a running lease whose owner is gone)
a worker picks the agent that runs it, by the run's `agent_name`; then `resolve_run` claims the
run (one compare-and-set on its lease: of all the workers trying, exactly one proceeds), settles
its cut-short calls by their tools' policies and resumes it with `Resumption.run`. A run whose
calls wait for a person (`'ask'`) is left `pending` and reported, without holding the others back;
a run whose agent this worker does not know, or whose chain was started by another version of the
application (`StepPersistence(version=...)`), is reported and left for a worker that runs it; a
run with nothing to resume from (it died before its first model request and its store kept no
start point) is ended as `abandoned`, by the one worker whose claim found it so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import Any, Literal, TypeAlias

from pydantic_ai import Agent

from stepcore.capability.persistence import step_persistences
from stepcore.common.telemetry import OrphanWatch, recovering_orphan
from stepcore.ownership.claims import claim_run
from stepcore.ownership.orphans import Orphan, list_orphans
from stepcore.recovery.paused import Waiting
from stepcore.recovery.policies import RecoveryPolicy, undeclared
from stepcore.recovery.resolution import RunAbandonedError, resolve_run
from stepcore.recovery.timers import WaitingWatch
from stepcore.store.contract import as_step_store
from stepcore.store.leases import (
    DEFAULT_LEASE_TTL,
    Lease,
    LeaseState,
    RunClaimedError,
    RunDeadError,
    RunFencedError,
    RunOwnedError,
)
from stepcore.store.models import RunRecord, utcnow
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.step_store import StepStore

__all__ = (
    'DEFAULT_MAX_RECOVERY_ATTEMPTS',
    'AgentChooser',
    'OrphanOutcome',
    'agent_chooser',
    'recover_orphans',
    'run_recovery_loop',
    'served_version',
)

logger = logging.getLogger('stepcore.recovery')

DEFAULT_MAX_RECOVERY_ATTEMPTS = 5
"""How many resumptions of a run may die before the recovery loop stops resuming it (sets it `dead`)."""

Outcome = Literal[
    'resumed',
    'failed',
    'pending',
    'finished',
    'unknown agent',
    'other version',
    'taken',
    'abandoned',
    'dead',
    'expired',
    'busy',
]

AgentChooser: TypeAlias = Callable[[RunRecord | None], 'Agent[Any, Any] | None']
"""Which agent resumes a run, from its record (`None` when the run has no record): `None` for none."""


@dataclass(frozen=True, slots=True)
class OrphanOutcome:
    """What one worker did with one orphan."""

    run_id: str
    outcome: Outcome
    """`resumed` (its resumption completed), `failed` (its resumption raised), `pending` (calls wait
    for a person), `finished` (nothing left to do), `unknown agent` (left for another worker),
    `other version` (its chain was started by another version of the application: left for a worker of
    that version), `taken` (another worker claimed it first, or its owner came back), `abandoned`
    (nothing to resume from), `dead` (its resumptions died `max_recovery_attempts` times: this worker
    set it `dead`, and nothing resumes it automatically any more), `expired` (a deferred call of a
    waiting run passed its deadline unanswered: this worker recorded its expiry), `busy` (the store
    failed in a way that passes, such as a lock held by a frozen writer's transaction or a timeout:
    the orphan is tried again at a later tick)."""
    detail: str = ''
    resumed_as: str | None = None
    """The run that resumed it, when one started."""
    lease: Lease | None = None
    """The orphan's lease as this worker's claim found it (its owner, and when it expired)."""
    claimed_at: datetime | None = None
    """When this worker's claim on the orphan succeeded (before its calls were settled)."""
    listed_at: datetime | None = None
    """When this worker first listed the orphan: `claimed_at` minus this is how long it waited here."""


def agent_chooser(agents: Mapping[str, Agent[Any, Any]] | Sequence[Agent[Any, Any]] | AgentChooser) -> AgentChooser:
    """`agents` as an `AgentChooser`: a mapping from agent name, or agents matched by their `name`
    (a run recorded without an agent name goes to the only agent given, if just one is)."""
    if callable(agents):
        return agents
    by_name: dict[str, Agent[Any, Any]] = (
        dict(agents) if isinstance(agents, Mapping) else {a.name: a for a in agents if a.name is not None}
    )
    only = next(iter(by_name.values())) if len(by_name) == 1 else None
    if not isinstance(agents, Mapping) and len(agents) == 1:
        only = agents[0]

    def choose(record: RunRecord | None) -> Agent[Any, Any] | None:
        name = record.agent_name if record is not None else None
        if name is None:
            return only
        return by_name.get(name)

    return choose


def served_version(agent: Agent[Any, Any]) -> str | None:
    """The version the agent's `StepPersistence` declares (`None` when it has none)."""
    attached = step_persistences(agent)
    return attached[0].version if attached else None


async def _recover_one(
    store: StepStore,
    orphan: Orphan,
    choose: AgentChooser,
    *,
    policies: Mapping[str, RecoveryPolicy] | None,
    lease_ttl: float,
    max_recovery_attempts: int | None,
    run_options: Mapping[str, Any],
    listed_at: datetime | None = None,
) -> OrphanOutcome:
    """What this worker does with `orphan` (see `_recover`), in a span telling its outcome and, from
    `listed_at` (when the loop first listed it), how long it waited for its claim."""
    with recovering_orphan(store, orphan, listed_at) as recovering:
        outcome = await _recover(
            store,
            orphan,
            choose,
            policies=policies,
            lease_ttl=lease_ttl,
            max_recovery_attempts=max_recovery_attempts,
            run_options=run_options,
        )
        return recovering.done(replace(outcome, listed_at=listed_at) if listed_at is not None else outcome)


async def _recover(
    store: StepStore,
    orphan: Orphan,
    choose: AgentChooser,
    *,
    policies: Mapping[str, RecoveryPolicy] | None,
    lease_ttl: float,
    max_recovery_attempts: int | None,
    run_options: Mapping[str, Any],
) -> OrphanOutcome:
    run_id = orphan.run_id
    record = await store.get_run(run_id=run_id)
    agent = choose(record)
    if agent is None:
        name = record.agent_name if record is not None else None
        return OrphanOutcome(run_id, 'unknown agent', f'no agent here runs {name!r}' if name else 'no agent given')
    wanted = orphan.lease.version
    if wanted is not None and (served := served_version(agent)) != wanted:
        here = f'version {served!r}' if served is not None else 'no version'
        return OrphanOutcome(
            run_id,
            'other version',
            f'run is version {wanted!r}, this worker runs {here}: left for a worker of {wanted!r}',
        )
    try:
        resumption = await resolve_run(
            store,
            run_id=run_id,
            agent=agent,
            policies=policies,
            lease_ttl=lease_ttl,
            max_recovery_attempts=max_recovery_attempts,
        )
    except RunDeadError as error:  # this worker's claim found it had died too often, and set it dead
        return OrphanOutcome(run_id, 'dead', str(error))
    except (RunClaimedError, RunOwnedError, RunFencedError) as error:  # another worker got there first
        return OrphanOutcome(run_id, 'taken', str(error))
    except RunAbandonedError as error:  # this worker's claim found it abandoned, and ended it
        return OrphanOutcome(run_id, 'abandoned', str(error))
    except LookupError as error:
        try:
            claim = await claim_run(store, run_id, ttl=lease_ttl, action='ending it')
        except (RunClaimedError, RunOwnedError) as taken:
            return OrphanOutcome(run_id, 'taken', str(taken))
        previous = claim.previous
        if previous is not None and previous.state is not LeaseState.RUNNING:
            await claim.restore()  # another worker ended (or resumed) it meanwhile: that one reports it
            return OrphanOutcome(run_id, 'taken', f'run {run_id!r} is {previous.describe()} meanwhile')
        await claim.release(state=LeaseState.ENDED, outcome='abandoned', note=str(error))
        return OrphanOutcome(run_id, 'abandoned', str(error))
    except Exception as error:
        if not store.is_transient(error):
            raise
        return OrphanOutcome(run_id, 'busy', f'{type(error).__name__}: {error}; tried again later')
    claimed = partial(
        OrphanOutcome,
        run_id,
        lease=resumption.claimed or orphan.lease,
        claimed_at=resumption.claimed_at or utcnow(),
    )
    if resumption.finished:
        return claimed('finished', 'its newest continuation had already finished')
    if resumption.pending:
        calls = ', '.join(f'{e.tool_name} ({e.tool_call_id})' for e in resumption.pending)
        detail = f'settle by hand: {calls}'
        bare = undeclared(agent, [e.tool_name for e in resumption.pending], policies)
        if bare:
            detail += (
                f'; tools with no recovery policy, so a person decides: {", ".join(bare)} (declare recovery_policy '
                "on them, or give the agent StepPersistence(default_recovery_policy='rerun' or a reconcile function))"
            )
            logger.warning('run %s waits for a person: tools %s have no recovery policy', run_id, ', '.join(bare))
        return claimed('pending', detail)
    try:
        result = await resumption.run(agent, **run_options)
    except (RunClaimedError, RunFencedError) as error:
        return claimed('taken', str(error))
    except Exception as error:
        return claimed('failed', f'{type(error).__name__}: {error}')
    lease = await store.get_lease(resumption.run_id)
    resumed_as = lease.resumed_by if lease is not None else None
    return claimed('resumed', f'output {result.output!r}', resumed_as=resumed_as)


async def recover_orphans(
    store: StepStoreProtocol,
    agents: Mapping[str, Agent[Any, Any]] | Sequence[Agent[Any, Any]] | AgentChooser,
    *,
    policies: Mapping[str, RecoveryPolicy] | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    concurrency: int = 4,
    limit: int | None = None,
    max_recovery_attempts: int | None = DEFAULT_MAX_RECOVERY_ATTEMPTS,
    **run_options: Any,
) -> list[OrphanOutcome]:
    """Resume every orphan of `store` this worker has an agent for, once (see the module docstring).

    `agents`: the agents this worker runs, by agent name (a mapping, or agents with their `name`), or a
    function choosing one from the run's record. At most `concurrency` orphans are resumed at a time,
    at most `limit` in all; suspects (see `suspect`) after the others, each alone. A run whose
    resumptions died `max_recovery_attempts` times (a tool that kills its worker every time) is set
    `dead` instead (`None`: no limit). `run_options` go to each `agent.run`. Answers what happened to
    each orphan.
    """
    if concurrency < 1:
        raise ValueError(f'concurrency={concurrency!r} resumes nothing: pass 1 or more')
    bound = as_step_store(store)
    choose = agent_chooser(agents)
    orphans = await list_orphans(bound)
    listing = OrphanWatch(bound)
    listing.listed(orphans)
    if limit is not None:
        orphans = orphans[:limit]
    gate = asyncio.Semaphore(concurrency)
    recover = partial(
        _recover_one,
        bound,
        choose=choose,
        policies=policies,
        lease_ttl=lease_ttl,
        max_recovery_attempts=max_recovery_attempts,
        run_options=run_options,
    )

    async def one(orphan: Orphan) -> OrphanOutcome:
        async with gate:
            outcome = await recover(orphan, listed_at=listing.first_listed(orphan.run_id))
        logger.info('orphan %s: %s %s', orphan.run_id, outcome.outcome, outcome.detail)
        return outcome

    ordinary = [o for o in orphans if not suspect(o)]
    outcomes = dict(zip((o.run_id for o in ordinary), await asyncio.gather(*(one(o) for o in ordinary)), strict=True))
    for orphan in orphans:  # then each suspect alone (see `suspect`)
        if orphan.run_id not in outcomes:
            outcomes[orphan.run_id] = await one(orphan)
    return [outcomes[o.run_id] for o in orphans]


async def _report(on_outcome: Callable[[OrphanOutcome], Awaitable[None] | None] | None, outcome: OrphanOutcome) -> None:
    """Hand `outcome` to `on_outcome`; what that callback raises is logged, not let through."""
    logger.info('orphan %s: %s %s', outcome.run_id, outcome.outcome, outcome.detail)
    if on_outcome is None:
        return
    try:
        done = on_outcome(outcome)
        if done is not None:
            await done
    except Exception as error:
        logger.warning('on_outcome failed for run %r: %s: %s', outcome.run_id, type(error).__name__, error)


async def _answered(store: StepStore, ready: list[Waiting]) -> list[Orphan]:
    """The waiting runs whose calls are all answered or expired (`ready`), as orphans to resume."""
    found: list[Orphan] = []
    for paused in ready:
        lease = await store.get_lease(paused.run_id)
        if lease is not None and lease.state is LeaseState.WAITING:
            found.append(Orphan(lease, 'answered'))
    return found


async def _first_of(events: Sequence[asyncio.Event], seconds: float) -> None:
    """Wait until one of `events` is set, or `seconds` have passed."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def suspect(orphan: Orphan) -> bool:
    """Whether `orphan` may be what kills its worker: a resumption that died (it is an orphan), or a
    run whose chain has resumptions that died. Such a run is resumed alone in its worker, so that a
    run which kills its worker every time takes no other resumption down with it (and charges no
    other chain a death)."""
    if orphan.lease.died:
        return True
    return orphan.lease.resumes is not None and orphan.why != 'answered'  # an answered one only paused


def _startable(
    waiting: Sequence[Orphan],
    busy: Collection[str],
    solo: bool,
    concurrency: int,
    listing: OrphanWatch,
    interval: float,
) -> Iterator[Orphan | None]:
    """Which of `waiting` (oldest first) to start now, beside the resumptions already running (`busy`;
    `solo`: one of them is a suspect, running alone); `None` for each one left waiting for room.

    At most `concurrency` run at once, and a suspect (see `suspect`) runs alone: it starts only when
    nothing else runs, and nothing starts beside it. A suspect kept waiting longer than `interval`
    since this worker first listed it stops this worker from starting anything else, so that it
    drains and takes the suspect (unless another worker does first).
    """
    running = len(busy)
    closed = solo or running >= concurrency
    now = utcnow()
    for orphan in waiting:
        if closed or running >= concurrency:
            yield None
        elif not suspect(orphan):
            running += 1
            yield orphan
        elif running == 0:
            closed = True
            yield orphan
        else:
            first = listing.first_listed(orphan.run_id)
            closed = first is not None and (now - first).total_seconds() > interval
            yield None


async def run_recovery_loop(
    store: StepStoreProtocol,
    agents: Mapping[str, Agent[Any, Any]] | Sequence[Agent[Any, Any]] | AgentChooser,
    *,
    interval: float = 10.0,
    stop: asyncio.Event | None = None,
    on_outcome: Callable[[OrphanOutcome], Awaitable[None] | None] | None = None,
    policies: Mapping[str, RecoveryPolicy] | None = None,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    concurrency: int = 4,
    max_recovery_attempts: int | None = DEFAULT_MAX_RECOVERY_ATTEMPTS,
    resume_answered: bool = False,
    **run_options: Any,
) -> None:
    """Resume orphans as they appear until `stop` is set (or the task is cancelled).

    At every tick it also applies the deadlines of deferred calls (`apply_deadlines`: a call past its
    deadline unanswered is recorded expired, and reported `expired` by the worker that recorded it),
    and, with `resume_answered=True`, resumes every waiting run whose calls are all answered or
    expired, like an orphan (claimed first: one worker resumes it).

    The loop is continuous, not a series of passes: it lists the orphans every `interval` seconds,
    and at once again when one of its resumptions ends while the last listing held more orphans than
    it had room for; it runs at most `concurrency` resumptions at a time, and hands each orphan's
    outcome to `on_outcome` as soon as that orphan is done. An orphan one of its own resumptions is
    busy with is not tried again. A suspect (a resumption that died, or a run of a chain some of whose
    resumptions died: see `suspect`) is resumed alone, nothing else beside it in this worker, so a run
    that kills its worker every time takes no other run down with it. A listing that fails (the store
    unreachable) is logged and retried at the next tick, as is a resumption that raises. Once `stop`
    is set it claims nothing more, lets the resumptions under way finish, and returns; cancelling it
    cancels them (their runs are orphans again when their leases expire).
    """
    if interval <= 0:
        raise ValueError(f'interval={interval!r} would never wait: pass a number of seconds > 0')
    if concurrency < 1:
        raise ValueError(f'concurrency={concurrency!r} resumes nothing: pass 1 or more')
    bound = as_step_store(store)
    choose = agent_chooser(agents)
    stopped = stop or asyncio.Event()
    freed = asyncio.Event()
    busy: dict[str, asyncio.Task[None]] = {}
    solo: set[str] = set()
    """The suspect among `busy`, resumed alone (see `suspect`)."""
    deadlines = WaitingWatch()
    listing = OrphanWatch(bound)

    recover = partial(
        _recover_one,
        bound,
        choose=choose,
        policies=policies,
        lease_ttl=lease_ttl,
        max_recovery_attempts=max_recovery_attempts,
        run_options=run_options,
    )

    async def one(orphan: Orphan, listed_at: datetime | None) -> None:
        try:
            outcome = await recover(orphan, listed_at=listed_at)
        except Exception as error:  # the store failed under the resumption: the orphan is tried again later
            kind: Outcome = 'busy' if bound.is_transient(error) else 'failed'
            outcome = OrphanOutcome(orphan.run_id, kind, f'{type(error).__name__}: {error}')
        await _report(on_outcome, outcome)

    def finished(run_id: str, _: object) -> None:
        busy.pop(run_id, None)
        solo.discard(run_id)
        freed.set()

    try:
        while not stopped.is_set():
            try:
                orphans = await list_orphans(bound)
                listing.listed(orphans)
            except Exception as error:
                logger.warning(
                    'listing orphans failed (%s: %s); trying again in %.1f s', type(error).__name__, error, interval
                )
                orphans = []
            try:
                expiries, waiting_runs = await deadlines.due_now(bound)
                listing.waiting_runs(waiting_runs)
                for expiry in expiries:
                    if expiry.recorded:
                        detail = f'{expiry.call.tool_name} ({expiry.call.tool_call_id}) passed its deadline unanswered'
                        await _report(on_outcome, OrphanOutcome(expiry.run_id, 'expired', detail))
                if resume_answered:
                    orphans += await _answered(bound, [w for w in waiting_runs if w.ready()])
            except Exception as error:
                logger.warning(
                    'applying deadlines failed (%s: %s); trying again in %.1f s', type(error).__name__, error, interval
                )
            waiting = [orphan for orphan in orphans if orphan.run_id not in busy]
            held = 0
            for orphan in _startable(waiting, busy, bool(solo), concurrency, listing, interval):
                if orphan is None:
                    held += 1
                    continue
                if suspect(orphan):
                    solo.add(orphan.run_id)
                first = listing.first_listed(orphan.run_id)
                task = asyncio.create_task(one(orphan, first), name=f'stepcore recovery of {orphan.run_id}')
                busy[orphan.run_id] = task
                task.add_done_callback(lambda done, run_id=orphan.run_id: finished(run_id, done))
            freed.clear()
            # Orphans left waiting for room: list again as soon as a resumption ends; else at the next tick.
            await _first_of([stopped, freed] if held else [stopped], interval)
    except BaseException:
        for task in busy.values():
            task.cancel()
        await asyncio.gather(*busy.values(), return_exceptions=True)
        raise
    await asyncio.gather(*busy.values(), return_exceptions=True)
