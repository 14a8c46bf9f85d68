"""Jobs: work started under an id the caller chooses, started once however often it is submitted.

A job is a run and its resumptions. `start_job(agent, prompt, job_id=...)` runs the agent with the
job id as the first run's id, so every resumption's lease and record carry it (`Lease.job`, the
`stepcore.job` metadata) and every fencing token of the chain has it as `origin`. Whether the job
starts is decided by one atomic operation in the store, the first run's lease (or, on a store without
leases, its registration): of two workers starting the same id at once, exactly one runs it. The
other, and any later submission of the same id, gets the conflict policy's answer:

- `on_conflict='use_existing'` (the default): wait until the job stops running (it completed, failed,
  waits for answers or for a person, was cancelled or given up on) and return how it stands;
- `on_conflict='fail'`: raise `JobExistsError` at once, saying how the job stands.

`job_runs` lists the runs of a job, oldest first, with how each stands and who owned it; `stepcore job
ID` prints them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from pydantic_ai import Agent
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import DeferredToolRequests

from stepcore.capability.context import JobLink, starting_job
from stepcore.capability.persistence import step_persistences
from stepcore.ownership.claims import has_leases
from stepcore.recovery.chains import continuations
from stepcore.store.contract import as_step_store
from stepcore.store.ids import validate_path_safe_run_id
from stepcore.store.leases import Lease, LeaseState, RunClaimedError
from stepcore.store.lifecycle import run_status
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.step_store import StepStore

__all__ = ('JobConflict', 'JobExistsError', 'JobResult', 'JobRun', 'job_runs', 'job_status', 'start_job')

JobConflict: TypeAlias = Literal['use_existing', 'fail']
"""What `start_job` does when the job id exists: wait for that job and return it, or refuse."""

_FINAL = ('completed', 'failed', 'waiting', 'pending', 'dead', 'cancelled', 'abandoned')


class JobExistsError(RuntimeError):
    """`start_job(..., on_conflict='fail')` found the job started already."""

    def __init__(self, job_id: str, status: str, run_id: str) -> None:
        where = f' (its newest run is {run_id!r})' if run_id != job_id else ''
        super().__init__(
            f'job {job_id!r} was started already and is {status}{where}: it is not started twice. Pass '
            "on_conflict='use_existing' to wait for it and get how it ends, or choose another job id"
        )
        self.job_id = job_id
        self.status = status
        self.run_id = run_id


@dataclass(frozen=True)
class JobResult:
    """How a job stands after `start_job`."""

    job_id: str
    started: bool
    """Whether this call started it (`False`: it existed, and this is how it stands)."""
    run_id: str
    """The newest run of the job (the job id itself until a resumption continues it)."""
    status: str
    """`completed`, `failed`, `waiting` (for answers to deferred calls), `pending` (for a person),
    `dead`, `cancelled`, `abandoned`, or `running` (still running when the wait timed out)."""
    result: AgentRunResult[Any] | None = None
    """The agent's result, when this call ran the job to its end or pause."""


@dataclass(frozen=True)
class JobRun:
    """One run of a job, as the store tells it."""

    run_id: str
    status: str
    """From the run's events: `completed`, `failed`, `unfinished` or `waiting`."""
    lease: Lease | None


def _find_store(agent: Agent[Any, Any]) -> StepStore:
    found = step_persistences(agent)
    if not found:
        raise ValueError(
            f'start_job needs an agent with StepPersistence attached; {agent.name or "this agent"!r} has none'
        )
    return found[0].bound_store


async def job_runs(store: StepStoreProtocol, job_id: str) -> list[JobRun]:
    """The runs of job `job_id` (its first run and the resumptions that continue it), oldest first;
    `LookupError` when the store has no such job."""
    bound = as_step_store(store)
    leases = has_leases(bound)
    if not await _exists(bound, job_id):
        raise LookupError(f'the store has no job {job_id!r}: start_job starts one, `stepcore runs` lists the runs')
    runs: list[JobRun] = []
    for run_id in await continuations(bound, job_id):
        status = run_status(await bound.list_events_page(run_id, newest=True, limit=1))
        runs.append(JobRun(run_id, status, await bound.get_lease(run_id) if leases else None))
    return runs


def job_status(runs: list[JobRun]) -> str:
    """How a job stands, from its newest run: see `JobResult.status`."""
    newest = runs[-1]
    lease = newest.lease
    if lease is None:
        return 'running' if newest.status == 'unfinished' else newest.status
    if lease.state is LeaseState.RUNNING:
        return 'running'  # live, or an orphan a recovery loop will resume
    if lease.state is LeaseState.ENDED:
        return lease.outcome if lease.outcome in _FINAL else newest.status
    return lease.state.value


async def start_job(
    agent: Agent[Any, Any],
    user_prompt: Any = None,
    *,
    job_id: str,
    on_conflict: JobConflict = 'use_existing',
    wait: float | None = None,
    poll: float = 0.2,
    **run_options: Any,
) -> JobResult:
    """Start job `job_id` with `agent` once (see the module docstring): `agent.run(user_prompt,
    **run_options)` with the job id as the run's id, unless a job of that id exists.

    `wait`: with `use_existing`, how many seconds at most to wait for an existing job to stop running
    (`None`: as long as it takes); the result then says `running`. `poll`: seconds between two looks.
    Whatever the run itself raises (a tool's error, a model's) comes through: the job then stands
    `failed`. The agent's `StepPersistence` must have no `run_id` of its own.
    """
    if on_conflict not in ('use_existing', 'fail'):
        raise ValueError(f"on_conflict={on_conflict!r} is not a policy: use 'use_existing' or 'fail'")
    try:
        validate_path_safe_run_id(job_id)
    except ValueError as error:
        raise ValueError(f'job_id {job_id!r} cannot name a job (it is its first run id): {error}') from None
    store = _find_store(agent)
    if not await _exists(store, job_id):
        link = JobLink(job_id)
        try:
            with starting_job(link):
                result = await agent.run(user_prompt, **run_options)
        except (RunClaimedError, ValueError):
            if not await _exists(store, job_id):
                raise
            # another worker started it first: the conflict policy answers
        except Exception as error:  # a lock the other starter's transaction held past the store's wait
            if link.leased or not store.is_transient(error) or not await _exists(store, job_id):
                raise  # (`leased`: the run this call started failed on its own, no other starter was in the way)
        else:
            status = 'waiting' if isinstance(result.output, DeferredToolRequests) else 'completed'
            newest = (await continuations(store, job_id))[-1]
            return JobResult(job_id, True, newest, status, result)
    runs = await job_runs(store, job_id)
    if on_conflict == 'fail':
        raise JobExistsError(job_id, job_status(runs), runs[-1].run_id)
    deadline = None if wait is None else time.monotonic() + wait
    while (status := job_status(runs)) == 'running' and (deadline is None or time.monotonic() < deadline):
        await asyncio.sleep(poll)
        runs = await job_runs(store, job_id)
    return JobResult(job_id, False, runs[-1].run_id, status)


async def _exists(store: StepStore, job_id: str) -> bool:
    if has_leases(store):
        lease = await store.get_lease(job_id)
        if lease is not None:
            return True
    return await store.get_run(run_id=job_id) is not None
