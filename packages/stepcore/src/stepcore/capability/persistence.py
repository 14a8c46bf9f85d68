"""`StepPersistence`: the capability that records a run's steps, snapshots and tool effects."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, cast

from pydantic_ai import Agent, ModelRequestNode, UserPromptNode
from pydantic_ai.capabilities.abstract import (
    AgentNode,
    CapabilityOrdering,
    NodeResult,
    ValidatedToolArgs,
    WrapRunHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, DeferredToolRequests, RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset

import stepcore.capability.snapshot_points as points
from stepcore.capability.context import (
    JOB_KEY,
    RESUMES_KEY,
    VERSION_KEY,
    ActiveToolCall,
    active_run_id,
    active_tool_call,
    inside_run,
    take_job,
    take_resumption,
)
from stepcore.capability.operations import CAPABILITY_ID, OPERATION_NAMES, StepOperations
from stepcore.capability.pause import AnswerWithin, check_answer_within, deferred_calls
from stepcore.capability.run_lease import end_lease, start_point, take_lease
from stepcore.capability.run_state import RunState, describe_error, resolve_run_id
from stepcore.capability.run_writer import DEFERRED_WRITE_DELAY, RunWriter
from stepcore.capability.tool_calls import ToolRaiseWitness, annotate_in_flight, record_tool_call
from stepcore.engine.memory import InMemoryStepStore
from stepcore.ownership.claims import has_leases
from stepcore.store.leases import DEFAULT_LEASE_TTL, LeaseState, RunClaimedError, fencing
from stepcore.store.models import EventKind, SnapshotState, utcnow
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.waiting import pause_metadata

__all__ = (
    'CAPABILITY_ID',
    'DEFERRED_WRITE_DELAY',
    'OPERATION_NAMES',
    'SPEC_DEFAULTS',
    'ActiveToolCall',
    'StepPersistence',
    'active_tool_call',
    'step_persistences',
)

SPEC_DEFAULTS: dict[str, dict[str, Any]] = {
    'file': {'directory': '.step-persistence'},
    'sqlite': {'database': '.step-persistence.db'},
}
"""Where `StepPersistence.from_spec` keeps the built-in file and SQLite backends' data when the spec does
not say (relative to the current directory), as pydantic-ai-harness does. Each backend declares its
own in its plugin (`BackendInfo.default_location`), which is what `from_spec` reads; this table is
what those two declare."""


@dataclass
class StepPersistence(StepOperations[AgentDepsT]):
    """Record a run's step events, continuable snapshots and tool-effect ledger in a `StepStore`.

    Attach it at `Agent(capabilities=[...])` construction. It runs where it is listed, as every
    capability does: `before_*` hooks in list order, `after_*` and error hooks in reverse, so list it
    before the capabilities whose `after_run` rewrites the history to save what they leave (or pass
    `outermost=True` to have it placed outside all the others). A capability listed before it that
    rejects a run in its `before_run` leaves nothing stored. Per run it registers a `RunRecord`,
    appends a `StepEvent` at every run, model-request and tool-call boundary, keeps a
    `ToolEffectRecord` per tool call, and saves a `ContinuableSnapshot`:

    - after every tool cycle whose calls all returned (the tool returns folded in), and after the
      final tool-less response;
    - at the end of the run when the final history differs from the newest boundary snapshot
      (`run_stream`'s closing response, a rewrite by another capability, a run with no boundary);
    - when the run fails: the history as it stood, `complete` if every tool call was answered and
      `interrupted` otherwise, whenever it holds a model response. When the run's first model
      request fails, that is the history the run was given, without its unanswered new prompt;
    - with `capture_frontier=True`, also the accepted request history before each model request
      (so a first request that fails leaves its prompt in a `complete` snapshot) and the proposed
      tool calls before they execute (`interrupted`), and at a failure even a history without a
      model response.

    After each snapshot write it emits `SnapshotSaved`.

    Tool calls are seen through `wrap_tool_execute`, so a call that ends with `ModelRetry`, a
    deferral (`CallDeferred`, `ApprovalRequired`) or any other exception is recorded `failed`; a call
    cut short by cancellation or a crash stays `started`. What the tool itself raised is seen below
    every capability (`get_wrapper_toolset`), so the `error` of its entry and a `tool_call_failed`
    event name the tool's own exception (`repr`) whatever other capabilities make of it: converted
    to another, or replaced by a substitute result (the call is then `completed`, its failure kept in
    the events). A call that returns is recorded `completed` only with, or after, a `complete`
    snapshot holding its result (see `RunWriter`): a call whose result never reaches one stays
    `started`.

    Durable execution: every store write, and every clock or uuid read that ends up stored, happens
    inside one of six durable operations (`OPERATION_NAMES`, scoped by the stable capability id
    `step_persistence`), so a replayed workflow reuses the journaled values and a retried run
    registration is recognised by its journaled `registration_id`.

    Run id: an explicit `run_id` is used as is (single use: a second run of the same instance
    fails with `ValueError`); with `agent_name` the id is `stepcore.store.ids.derive_run_id(agent_name,
    ctx.run_id)` (an `sp-` id, the same pydantic-ai-harness derives); otherwise `ctx.run_id`.
    `parent_run_id` defaults to the run id of the enclosing `StepPersistence` run in this context
    (in-process delegation). The copy `for_run` returns carries the resolved values in `run_id`,
    `parent_run_id` and `agent_name`.
    """

    store: StepStoreProtocol = field(default_factory=InMemoryStepStore)
    """Where runs, events, snapshots and tool effects go: any object with the reference's store
    methods (`stepcore.StepStoreProtocol`), a `StepStore` subclass included."""
    agent_name: str | None = None
    """Logical agent name, recorded on the run and encoded into the derived run id.

    When unset, records carry the running agent's name, and the run id stays `ctx.run_id`.
    """
    run_id: str | None = None
    """Explicit id for one single `Agent.run` of this instance."""
    parent_run_id: str | None = None
    """The run that spawned this one; inferred for in-process delegation when unset."""
    metadata: dict[str, str] = field(default_factory=dict[str, str])
    """Stored on the run record, its events and snapshots."""
    capture_frontier: bool = False
    """Also checkpoint accepted requests before model calls and proposed tool calls before they run."""

    _: KW_ONLY
    id: str | None = CAPABILITY_ID
    outermost: bool = False
    """Place the capability outside every other one, whatever the list order (its `before_run`
    first, its `after_run` last), instead of where it is listed."""
    lease_ttl: float | None = DEFAULT_LEASE_TTL
    """Seconds the run's lease in its store lasts unless renewed (every third of it, on a timer, while
    the run lives): how long after a crash its run counts as orphaned when no process on the same host
    can tell its owner is gone. `None` takes no lease. Only on a store that keeps leases (feature
    `leases`), and never under a durable engine, which owns the run (see docs/fleet.md)."""
    answer_within: AnswerWithin = None
    """How long a deferred tool call (one that needs approval, or a result from outside) of a run that
    pauses waits for its answer: seconds or a `timedelta` for every call, or a mapping of tool names to
    one. A call unanswered by then is denied when the run is resumed, and answers to it are refused
    (see docs/approvals.md). `None`: the calls wait as long as it takes."""
    default_recovery_policy: Any = None
    """How recovery settles a cut-short call of this agent's tools that declare no policy of their own
    (`recovery_policy`): `'rerun'`, `'ask'` or a reconcile function (see docs/recovery-policies.md).
    `None`: `'ask'`, a person settles it."""
    version: str | None = None
    """The version of the application code running the agent (any string you choose: a release, a
    commit). It is stored with the run (its record's `stepcore.version` metadata and its lease) and
    carried by its resumptions, and the recovery loop resumes an orphan only with an agent of the
    version its chain was started by: a worker running new code (tools renamed, arguments changed)
    leaves the runs of old code to a worker of their version. `None`: any worker resumes the run."""

    def __post_init__(self) -> None:
        self._state: RunState | None = None
        self._answer_within = check_answer_within(self.answer_within)
        ttl = cast(object, self.lease_ttl)
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0):
            raise ValueError(
                f'StepPersistence lease_ttl={ttl!r} cannot hold a lease: pass a number of seconds > 0, '
                'or None to take no lease'
            )
        version = cast(object, self.version)
        if version is not None and (not isinstance(version, str) or not version.strip()):
            raise ValueError(
                f'StepPersistence version={version!r} is no version: pass a non-empty string (a release, a commit) '
                'or None'
            )
        policy = cast(object, self.default_recovery_policy)
        if policy is not None and policy not in ('rerun', 'ask') and (isinstance(policy, str) or not callable(policy)):
            raise ValueError(
                f"StepPersistence default_recovery_policy={policy!r} is no recovery policy: pass 'rerun', 'ask', "
                'a reconcile function, or None'
            )
        _ = self.bound_store  # a store without the contract's methods is refused here, naming them
        for key, value in cast(dict[object, object], self.metadata).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(
                    f'StepPersistence metadata must map strings to strings; got {key!r}: {value!r} '
                    '(convert the value with str() or leave it out)'
                )

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def from_spec(  # pyright: ignore[reportIncompatibleMethodOverride]
        cls,
        backend: str = 'memory',
        *,
        agent_name: str | None = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        metadata: dict[str, str] | None = None,
        capture_frontier: bool = False,
        lease_ttl: float | None = DEFAULT_LEASE_TTL,
        answer_within: float | dict[str, float] | None = None,
        version: str | None = None,
        **store_options: Any,
    ) -> StepPersistence[Any]:
        """Build the capability and its store from plain values (as in an agent spec).

        `backend` is a plugin key (`memory`, `file`, `sqlite`, `postgres`, `mongo`, ...); every
        keyword that is not one of the capability's own fields is an option of that backend's store
        (`max_snapshots_per_run`, `database`, `directory`, ...) and is passed to
        `stepcore.plugins.registry.store_from_spec(backend, **store_options)` unchanged: the backend decides
        which options it takes. An unknown backend raises `ValueError` ("unknown backend ..."): there
        is no fallback to memory.

        Without a location, `backend='file'` uses the folder `.step-persistence` and `backend='sqlite'`
        the database `.step-persistence.db`. Both are relative paths, so they are found in the
        current directory when the store is first used, not when the spec is read.
        """
        from stepcore.plugins.registry import get_registry

        registered = get_registry().get('step', backend)
        defaults = registered.info.default_location
        if not any(name in store_options for name in (*defaults, *registered.info.location_options)):
            store_options = {**defaults, **store_options}
        store = cast(StepStoreProtocol, registered.create(**store_options))
        return StepPersistence[Any](
            store=store,
            agent_name=agent_name,
            run_id=run_id,
            parent_run_id=parent_run_id,
            metadata=dict(metadata or {}),
            capture_frontier=capture_frontier,
            lease_ttl=lease_ttl,
            answer_within=answer_within,
            version=version,
        )

    def get_ordering(self) -> CapabilityOrdering | None:
        """Where it was listed, unless `outermost=True` asked for the outside of every other capability."""
        return CapabilityOrdering(position='outermost') if self.outermost else None

    def compaction_transcript_handle(self) -> str | None:
        """This run's id in the store (for compaction receipts).

        That is `run_id`: the resolved id on the copy `for_run` returns; on the instance attached to
        the agent, the explicit `run_id` or `None`.
        """
        return self.run_id

    @property
    def resolved_run_id(self) -> str | None:
        """The run id records are stored under, once `for_run` resolved it."""
        return self._state.run_id if self._state is not None else None

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> StepPersistence[AgentDepsT]:
        """The copy that records this run: its `run_id`, `parent_run_id` and `agent_name` are the resolved ones.

        Started by `stepcore.start_job`, the run's id is the job id.
        """
        job = take_job()
        if job is not None and self.run_id is not None and self.run_id != job:
            raise ValueError(
                f'start_job(job_id={job!r}) runs an agent whose StepPersistence has run_id={self.run_id!r}: a job '
                'names its own first run; attach StepPersistence without run_id'
            )
        run_id = job if job is not None else resolve_run_id(ctx, run_id=self.run_id, agent_name=self.agent_name)
        agent = ctx.agent
        parent_run_id = self.parent_run_id if self.parent_run_id is not None else active_run_id()
        agent_name = self.agent_name if self.agent_name is not None else (agent.name if agent is not None else None)
        copy = replace(self, run_id=run_id, parent_run_id=parent_run_id, agent_name=agent_name)
        copy._state = copy._new_run(ctx)
        copy._state.job = job
        return copy

    def _new_run(self, ctx: RunContext[Any]) -> RunState:
        """The state of the run `ctx` belongs to, recorded under this instance's (resolved) ids."""
        run_id = (
            self.run_id if self.run_id is not None else resolve_run_id(ctx, run_id=None, agent_name=self.agent_name)
        )
        # Inside a durable container the operations are journaled: one per write, nothing batched.
        writer = RunWriter(self.bound_store, self, journaled=ctx.in_durable_context, run_id=run_id)
        return RunState(
            run_id=run_id,
            parent_run_id=self.parent_run_id,
            agent_name=self.agent_name,
            conversation_id=ctx.conversation_id,
            metadata=dict(self.metadata),
            writer=writer,
        )

    def _run(self, ctx: RunContext[Any], *, node: bool = False) -> RunState:
        """The run's state; from a node, model or tool hook (`node=True`), brought up to its step.

        A hook called on an instance `for_run` did not bind (as a test may call one) records the
        run `ctx` belongs to, as the reference's hooks do.
        """
        if self._state is None:
            self._state = self._new_run(ctx)
        if node:
            self._state.step_index = ctx.run_step
            self._state.live = ctx.messages
        return self._state

    # --- saving and events --------------------------------------------------------------------

    async def _save(
        self,
        ctx: RunContext[Any],
        messages: list[ModelMessage],
        state: SnapshotState,
        *,
        defer: bool = False,
        run: RunState | None = None,
    ) -> None:
        """Save `messages` as a snapshot; `SnapshotSaved` is emitted once it is written.

        With `defer=True` the snapshot travels with the run's next write and is encoded then, so a
        request pydantic-ai stamps for sending in the meantime is stored once, as sent, instead of
        unstamped now and again stamped at the next save. `run`: the run's state, when the caller has it.
        """
        run = run or self._run(ctx)
        snapshot = run.snapshot(messages, state)
        if defer:
            await run.writer.defer(ctx, snapshot=snapshot)
        else:
            await run.writer.write(ctx, snapshot=snapshot)
        run.content.update(messages, encode_tail=not defer)

    async def _event(
        self,
        ctx: RunContext[Any],
        kind: EventKind,
        *,
        error: BaseException | None = None,
        defer: bool = False,
        run: RunState | None = None,
    ) -> None:
        run = run or self._run(ctx)
        discriminator = 'run' if kind.value.startswith('run_') else str(run.step_index)
        event = run.event(kind, discriminator=discriminator, error=None if error is None else describe_error(error))
        await (run.writer.defer(ctx, event) if defer else run.writer.write(ctx, event))

    # --- run lifecycle -------------------------------------------------------------------------

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        run = self._run(ctx)
        with inside_run(run.run_id), fencing(run.fence):
            try:
                return await handler()
            finally:
                if run.keeper is not None:  # a run abandoned without its end hooks: stop renewing its lease
                    run.keeper.stop_soon()

    def _leased(self, ctx: RunContext[Any]) -> bool:
        """Whether this run takes a lease (see `lease_ttl`)."""
        return self.lease_ttl is not None and not ctx.in_durable_context and has_leases(self.bound_store)

    async def before_run(self, ctx: RunContext[AgentDepsT]) -> None:
        run = self._run(ctx)
        run.given = list(ctx.messages)
        record = run.run_record()
        resumed = take_resumption()  # started by `Resumption.run`: the run it resumes, and recovery's claim
        if resumed is not None:
            record.metadata[RESUMES_KEY] = resumed[0]
        version, job = self.version, run.job
        if self._leased(ctx):
            assert self.lease_ttl is not None
            try:
                lease = await take_lease(
                    self.bound_store,
                    run,
                    ttl=self.lease_ttl,
                    resumes=resumed[0] if resumed is not None else None,
                    claim=resumed[1] if resumed is not None else None,
                    start=start_point(ctx, run.given) if resumed is None else None,
                    version=version,
                    job=job,
                )
            except RunClaimedError:
                # The run id is taken. When its run is registered, registration says so as the reference
                # does; before that, registering here could come first and fail the run that holds the id.
                if resumed is None and await self.bound_store.get_run(run_id=run.run_id) is not None:
                    await self.journal_registration(ctx, record)
                raise
            version, job = lease.version, lease.job
        if version is not None:
            record.metadata[VERSION_KEY] = version
        if job is not None:
            record.metadata[JOB_KEY] = job
        try:
            await self.journal_registration(ctx, record)
        except BaseException as error:
            await end_lease(run, state=LeaseState.ENDED, outcome='refused', error=error)
            raise
        await self._event(ctx, EventKind.RUN_STARTED)

    async def after_run(self, ctx: RunContext[AgentDepsT], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        run = self._run(ctx)
        if isinstance(result.output, DeferredToolRequests):
            await self._pause(ctx, result, result.output)
            run.writer.end()
            await end_lease(run, state=LeaseState.WAITING, outcome='paused')
            return result
        if (final := points.final_history(run, result)) is not None:
            await self._save(ctx, final, run.state_of(final))
        await self._event(ctx, EventKind.RUN_COMPLETED)
        run.writer.end()
        await end_lease(run, state=LeaseState.ENDED, outcome='completed')
        return result

    async def _pause(self, ctx: RunContext[Any], result: AgentRunResult[Any], requests: DeferredToolRequests) -> None:
        """Record that the run waits on deferred tool calls (see `stepcore.capability.pause`)."""
        run = self._run(ctx)
        history = list(result.all_messages())
        fresh = run.content.differs(history) if history else False
        snapshot = run.snapshot(history, run.state_of(history)) if fresh else None
        calls = deferred_calls(requests, now=utcnow(), within=self._answer_within)
        event = run.event(EventKind.RUN_COMPLETED, discriminator='run')
        event.metadata.update(pause_metadata(calls))
        await run.writer.pause(ctx, event, snapshot=snapshot, history=history)
        if fresh:
            run.content.update(history, encode_tail=True)

    async def on_run_error(self, ctx: RunContext[AgentDepsT], *, error: BaseException) -> AgentRunResult[Any]:
        run = self._run(ctx)
        try:
            if (messages := points.at_failure(run, capture_frontier=self.capture_frontier)) is not None:
                await self._save(ctx, messages, run.state_of(messages))
            await self._event(ctx, EventKind.RUN_FAILED, error=error)
        except Exception as store_error:
            error.add_note(f'StepPersistence could not record the failure: {describe_error(store_error)}')
        run.writer.end()
        if _store_failed(run, error):
            # the run did not fail: its store did, in a way that passes (a dropped connection, a timeout).
            # Ended as a crash, so recovery resumes it from what was stored, instead of as `failed`.
            await end_lease(run, state=LeaseState.RUNNING, outcome='write failed', error=error, crashed=True)
        else:
            await end_lease(run, state=LeaseState.ENDED, outcome='failed', error=error)
        raise error

    # --- nodes and model requests ----------------------------------------------------------------

    async def before_node_run(
        self, ctx: RunContext[AgentDepsT], *, node: AgentNode[AgentDepsT]
    ) -> AgentNode[AgentDepsT]:
        run = self._run(ctx, node=True)
        if self.capture_frontier and (messages := points.proposed_calls(run, ctx, node)) is not None:
            await self._save(ctx, messages, run.state_of(messages), run=run)
        return node

    async def after_node_run(
        self, ctx: RunContext[AgentDepsT], *, node: AgentNode[AgentDepsT], result: NodeResult[AgentDepsT]
    ) -> NodeResult[AgentDepsT]:
        run = self._run(ctx, node=True)
        run.progressed = run.progressed or not isinstance(node, UserPromptNode)
        if (messages := points.settled_tool_cycle(run, ctx, node, result)) is not None:
            # Before another model request the snapshot goes with that request's started event.
            await self._save(ctx, messages, SnapshotState.COMPLETE, defer=isinstance(result, ModelRequestNode), run=run)
        return result

    async def before_model_request(
        self, ctx: RunContext[AgentDepsT], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        run = self._run(ctx, node=True)
        await self._event(ctx, EventKind.MODEL_REQUEST_STARTED, run=run)
        if self.capture_frontier and (messages := points.accepted_requests(run, ctx)) is not None:
            await self._save(ctx, messages, run.state_of(messages), run=run)
        return request_context

    async def after_model_request(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        run = self._run(ctx, node=True)
        await self._event(ctx, EventKind.MODEL_REQUEST_COMPLETED, defer=True, run=run)
        return response

    async def on_model_request_error(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, error: Exception
    ) -> ModelResponse:
        self._run(ctx, node=True)
        await self._event(ctx, EventKind.MODEL_REQUEST_FAILED, error=error)
        raise error

    # --- tool calls ----------------------------------------------------------------------------

    def get_wrapper_toolset(self, toolset: AbstractToolset[AgentDepsT]) -> AbstractToolset[AgentDepsT] | None:
        """The run's toolset, wrapped so the ledger learns what each tool itself raised (see
        `ToolRaiseWitness`)."""
        return ToolRaiseWitness(toolset)

    async def wrap_tool_execute(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        return await record_tool_call(self._run(ctx, node=True), ctx, call, self, lambda: handler(args))

    async def annotate(
        self,
        ctx: RunContext[Any],
        store: StepStoreProtocol,
        tool_call_id: str,
        *,
        idempotency_key: str | None,
        effect_summary: str | None,
    ) -> None:
        """Merge annotations into the in-flight record of `tool_call_id` (see `annotate_tool_effect`)."""
        await annotate_in_flight(
            self._run(ctx),
            ctx,
            store if store is not self.store else self.bound_store,
            tool_call_id,
            idempotency_key=idempotency_key,
            effect_summary=effect_summary,
        )


def step_persistences(agent: Agent[Any, Any]) -> list[StepPersistence[Any]]:
    """The `StepPersistence` capabilities attached to `agent`, in the order its capabilities run."""
    found: list[StepPersistence[Any]] = []

    def visit(capability: object) -> None:
        if isinstance(capability, StepPersistence):
            found.append(cast(StepPersistence[Any], capability))

    agent.root_capability.apply(visit)
    return found


def _store_failed(run: RunState, error: BaseException) -> bool:
    """Whether `error` is a passing failure of a write to the run's store (or has one as its cause)."""
    failed = run.writer.failed
    if failed is None:
        return False
    seen: BaseException | None = error
    while seen is not None and seen is not failed:
        seen = seen.__cause__ or seen.__context__
    return seen is failed and run.writer.store.is_transient(failed)
