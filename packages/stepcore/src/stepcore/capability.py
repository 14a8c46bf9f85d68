"""`StepPersistence`: the capability that records a run's steps, snapshots and tool effects."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import datetime
from typing import Any, cast

from pydantic import BaseModel
from pydantic_ai import CallToolsNode, ModelRequestNode
from pydantic_ai.capabilities import durable_operation
from pydantic_ai.capabilities.abstract import (
    AbstractCapability,
    AgentNode,
    NodeResult,
    ValidatedToolArgs,
    WrapRunHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, RunContext, ToolDefinition

from .codec import encode_message
from .events import SnapshotSaved
from .helpers import SettledTracker
from .history import TAIL_RECHECK, trusted_prefix
from .ids import derive_run_id
from .memory import InMemoryStepStore
from .models import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
    utcnow,
)
from .protocols import StepStore, StepWrite
from .writes import apply_writes

__all__ = ('CAPABILITY_ID', 'OPERATION_NAMES', 'ActiveToolCall', 'StepPersistence', 'active_tool_call')

CAPABILITY_ID = 'step_persistence'
"""The stable capability id: durable operation names are scoped by it."""

OPERATION_NAMES = (
    'registration_identity',
    'register_run',
    'append_event',
    'save_snapshot',
    'tool_effect_started',
    'tool_effect_finished',
)
"""The durable operations of the capability, one per store boundary. Persisted by durable engines: never rename."""

_UNKNOWN = object()

DEFERRED_WRITE_DELAY = 0.01
"""Seconds a deferred write (a model request's completion, a tool call's end) waits at most for the
run's next write before it is written on its own (when the event loop is free)."""

logger = logging.getLogger('stepcore')

_ACTIVE_RUN_ID: ContextVar[str | None] = ContextVar('stepcore_active_run_id', default=None)
"""The run id of the innermost enclosing `StepPersistence.wrap_run`, read by delegates as their parent."""


@dataclass(frozen=True, slots=True)
class ActiveToolCall:
    """The tool call a `StepPersistence` is currently executing (see `annotate_tool_effect`)."""

    capability: StepPersistence[Any]
    run_id: str
    tool_call_id: str


_ACTIVE_TOOL_CALL: ContextVar[ActiveToolCall | None] = ContextVar('stepcore_active_tool_call', default=None)


def active_tool_call() -> ActiveToolCall | None:
    """The tool call being executed under a `StepPersistence` in this context, if any."""
    return _ACTIVE_TOOL_CALL.get()


class _RegistrationIdentity(BaseModel):
    registration_id: str
    started_at: datetime


def _empty_metadata() -> dict[str, str]:
    return {}


class _ContentTracker:
    """The content of the newest saved history.

    Keeps the saved message objects and the encodings of the newest `history.TAIL_RECHECK` of them,
    which pydantic-ai stamps in place after a save. Older positions are compared by identity, and
    only where another object sits there by encoding both: messages older than the tail are never
    changed in place, so encoding them later gives what encoding them at save time would have.
    """

    def __init__(self) -> None:
        self.messages: list[ModelMessage] = []
        self.tail: list[bytes] | None = []
        """`None` when the tail was not encoded at save time: it then counts as changed."""
        self.saved = False

    def differs(self, messages: Sequence[ModelMessage]) -> bool:
        if not self.saved or len(messages) != len(self.messages):
            return True
        boundary = len(messages) - min(len(messages), TAIL_RECHECK)
        for i in range(trusted_prefix(messages, self.messages), boundary):
            old, new = self.messages[i], messages[i]
            if old is not new and encode_message(old) != encode_message(new):
                return True
        return self.tail is None or [encode_message(m) for m in messages[boundary:]] != self.tail

    def same_objects(self, messages: Sequence[ModelMessage]) -> bool:
        """True when `messages` holds exactly the saved message objects (maybe stamped since)."""
        return (
            self.saved
            and len(messages) == len(self.messages)
            and all(a is b for a, b in zip(messages, self.messages, strict=True))
        )

    def update(self, messages: Sequence[ModelMessage], *, encode_tail: bool = True) -> None:
        """Remember `messages` as saved; without `encode_tail` a later `differs` on them says True.

        The tail is left unencoded for a tool cycle's snapshot that travels with the next
        request: the next boundary replaces it before anything compares against it.
        """
        self.messages = list(messages)
        self.tail = [encode_message(m) for m in self.messages[-TAIL_RECHECK:]] if encode_tail else None
        self.saved = True


@dataclass
class _RunState:
    run_id: str
    parent_run_id: str | None
    agent_name: str | None = None
    conversation_id: str | None = None
    step_index: int = 0
    save_seq: int = 0
    key_counts: dict[str, int] = field(default_factory=dict[str, int])
    content: _ContentTracker = field(default_factory=_ContentTracker)
    settled: SettledTracker = field(default_factory=SettledTracker)
    live: list[ModelMessage] | None = None
    in_flight: dict[str, ToolEffectRecord] = field(default_factory=dict[str, ToolEffectRecord])
    deferred: list[StepWrite] = field(default_factory=list[StepWrite])
    """Writes that travel with the run's next write (see `StepPersistence._write`)."""
    deferred_snapshot: ContinuableSnapshot | None = None
    """A boundary snapshot that travels with the run's next write, after `deferred`."""
    unannounced: list[ContinuableSnapshot] = field(default_factory=list[ContinuableSnapshot])
    """Written snapshots whose `SnapshotSaved` is still to be emitted: right after the write, or,
    for one a background flush wrote, by the next write made from a hook."""
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    flush_timer: asyncio.TimerHandle | None = None
    flush_tasks: set[asyncio.Task[None]] = field(default_factory=set[asyncio.Task[None]])
    """Background flushes of deferred writes, kept referenced while they run."""

    def next_key(self, base: str) -> str:
        n = self.key_counts.get(base, 0) + 1
        self.key_counts[base] = n
        return f'{base}:{n}'


def _describe(error: BaseException) -> str:
    return f'{type(error).__name__}: {error}'


@dataclass
class StepPersistence(AbstractCapability[AgentDepsT]):
    """Record a run's step events, continuable snapshots and tool-effect ledger in a `StepStore`.

    Attach it at `Agent(capabilities=[...])` construction (before capabilities whose `after_run`
    rewrites the history). Per run it registers a `RunRecord`, appends a `StepEvent` at every
    run, model-request and tool-call boundary, keeps a `ToolEffectRecord` per tool call, and saves
    a `ContinuableSnapshot`:

    - after every tool cycle whose calls all returned (the tool returns folded in), and after the
      final tool-less response;
    - at the end of the run when the final history differs from the newest boundary snapshot
      (`run_stream`'s closing response, a rewrite by another capability, a run with no boundary);
    - when the run fails: the history as it stood, `complete` if every tool call was answered and
      `interrupted` otherwise, whenever it holds a model response;
    - with `capture_frontier=True`, also the accepted request history before each model request
      and the proposed tool calls before they execute (both `interrupted`).

    After each snapshot write it emits `SnapshotSaved`.

    Tool calls are seen through `wrap_tool_execute`, so a call that ends with `ModelRetry`, a
    deferral (`CallDeferred`, `ApprovalRequired`) or any other exception is recorded `failed` with
    the exception named in `error`; a call cut short by cancellation or a crash stays `started`.

    Durable execution: every store write, and every clock or uuid read that ends up stored, happens
    inside one of six durable operations (`OPERATION_NAMES`, scoped by the stable capability id
    `step_persistence`), so a replayed workflow reuses the journaled values and a retried run
    registration is recognised by its journaled `registration_id`.

    Run id: an explicit `run_id` is used as is (single use: a second run of the same instance
    fails with `ValueError`); with `agent_name` the id is `stepcore.ids.derive_run_id(agent_name,
    ctx.run_id)`; otherwise `ctx.run_id`. `parent_run_id` defaults to the run id of the enclosing
    `StepPersistence` run in this context (in-process delegation).
    """

    store: StepStore = field(default_factory=InMemoryStepStore)
    """Where runs, events, snapshots and tool effects go."""
    agent_name: str | None = None
    """Logical agent name, recorded on the run and encoded into the derived run id.

    When unset, records carry the running agent's name, and the run id stays `ctx.run_id`.
    """
    run_id: str | None = None
    """Explicit id for one single `Agent.run` of this instance."""
    parent_run_id: str | None = None
    """The run that spawned this one; inferred for in-process delegation when unset."""
    metadata: dict[str, str] = field(default_factory=_empty_metadata)
    """Stored on the run record, its events and snapshots."""
    capture_frontier: bool = False
    """Also checkpoint accepted requests before model calls and proposed tool calls before they run."""

    _: KW_ONLY
    id: str | None = CAPABILITY_ID

    def __post_init__(self) -> None:
        self._state: _RunState | None = None
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
        max_snapshots_per_run: int | None = None,
        database: str | None = None,
        directory: str | None = None,
        db_url: str | None = None,
        media_threshold_bytes: int | None = None,
        agent_name: str | None = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        metadata: dict[str, str] | None = None,
        capture_frontier: bool = False,
        **options: Any,
    ) -> StepPersistence[Any]:
        """Build the capability and its store from plain values (as in an agent spec).

        `backend` is a plugin key (`memory`, `file`, `sqlite`, `mongo`, ...). The store options given
        (`max_snapshots_per_run`, `database` for a SQLite file or a MongoDB database name,
        `directory`, `db_url`, `media_threshold_bytes`, and any other keyword) are passed to that
        backend's constructor; options left at `None` are not passed. An unknown key raises
        `ValueError`: there is no fallback to memory.
        """
        from .registry import store_from_spec

        store_options: dict[str, Any] = {
            name: value
            for name, value in (
                ('max_snapshots_per_run', max_snapshots_per_run),
                ('database', database),
                ('directory', directory),
                ('db_url', db_url),
                ('media_threshold_bytes', media_threshold_bytes),
            )
            if value is not None
        }
        store_options.update(options)
        store = cast(StepStore, store_from_spec(backend, **store_options))
        return StepPersistence[Any](
            store=store,
            agent_name=agent_name,
            run_id=run_id,
            parent_run_id=parent_run_id,
            metadata=dict(metadata or {}),
            capture_frontier=capture_frontier,
        )

    def compaction_transcript_handle(self) -> str | None:
        """This run's id in the store (for compaction receipts); `None` before the run started."""
        return self._state.run_id if self._state is not None else None

    @property
    def resolved_run_id(self) -> str | None:
        """The run id records are stored under, once `for_run` resolved it."""
        return self._state.run_id if self._state is not None else None

    def _resolve_run_id(self, ctx: RunContext[Any]) -> str:
        if self.run_id is not None:
            return self.run_id
        context_run_id = ctx.run_id
        if not context_run_id:
            raise RuntimeError(
                'StepPersistence needs the run id pydantic-ai assigns to each run, but RunContext.run_id is '
                f'{context_run_id!r}: pass run_id= to StepPersistence or run the agent through Agent.run/iter'
            )
        if self.agent_name is not None:
            return derive_run_id(self.agent_name, context_run_id)
        return context_run_id

    async def for_run(self, ctx: RunContext[AgentDepsT]) -> StepPersistence[AgentDepsT]:
        run_id = self._resolve_run_id(ctx)
        parent = self.parent_run_id if self.parent_run_id is not None else _ACTIVE_RUN_ID.get()
        agent = ctx.agent
        copy = replace(self)
        copy._state = _RunState(
            run_id=run_id,
            parent_run_id=parent,
            agent_name=self.agent_name if self.agent_name is not None else (agent.name if agent is not None else None),
            conversation_id=ctx.conversation_id,
        )
        return copy

    def _run(self) -> _RunState:
        if self._state is None:
            raise RuntimeError('StepPersistence hooks ran without for_run: attach the capability to an Agent')
        return self._state

    # --- durable operations: every store write and every persisted clock read ----------------

    @durable_operation(name='registration_identity')
    async def _op_registration_identity(self, ctx: RunContext[Any]) -> _RegistrationIdentity:
        return _RegistrationIdentity(registration_id=uuid.uuid4().hex, started_at=utcnow())

    @durable_operation(name='register_run')
    async def _op_register_run(self, ctx: RunContext[Any], record: RunRecord) -> None:
        await self.store.register_run(record)

    @durable_operation(name='append_event')
    async def _op_append_event(self, ctx: RunContext[Any], event: StepEvent) -> datetime:
        timestamp = utcnow()
        await self.store.append_event(event.model_copy(update={'timestamp': timestamp}))
        return timestamp

    @durable_operation(name='save_snapshot')
    async def _op_save_snapshot(self, ctx: RunContext[Any], snapshot: ContinuableSnapshot) -> datetime:
        created_at = utcnow()
        await self.store.save_snapshot(snapshot.model_copy(update={'created_at': created_at}))
        return created_at

    @durable_operation(name='tool_effect_started')
    async def _op_tool_effect_started(
        self, ctx: RunContext[Any], record: ToolEffectRecord, new_call: bool
    ) -> ToolEffectRecord:
        now = utcnow()
        stamped = record.model_copy(update={'started_at': now, 'updated_at': now} if new_call else {'updated_at': now})
        await self.store.record_tool_effect(stamped)
        return stamped

    @durable_operation(name='tool_effect_finished')
    async def _op_tool_effect_finished(self, ctx: RunContext[Any], record: ToolEffectRecord) -> ToolEffectRecord:
        stamped = record.model_copy(update={'updated_at': utcnow()})
        await self.store.record_tool_effect(stamped)
        return stamped

    # --- writing helpers ----------------------------------------------------------------------

    def _journaled(self, ctx: RunContext[Any]) -> bool:
        """Whether a durable engine dispatches this capability's operations in this run.

        Without one, the durable operations would run inline anyway, so the hooks write to the
        store directly and send a tool call's ledger entry and event in one `write_batch`.
        """
        operations = getattr(ctx, '_durable_operations', _UNKNOWN)
        if operations is _UNKNOWN:
            return True  # pydantic-ai's internals moved: the durable-operation path is always correct
        return bool(operations) and (self.id, 'append_event') in cast(dict[tuple[str, str], object], operations)

    def _new_event(
        self,
        kind: EventKind,
        *,
        discriminator: str,
        step_index: int | None = None,
        tool_name: str | None = None,
        tool_call_id: str | None = None,
        error: str | None = None,
    ) -> StepEvent:
        st = self._run()
        # Every field from a value of its declared type: validation is skipped (it is per event).
        return StepEvent.model_construct(
            run_id=st.run_id,
            kind=kind,
            step_index=st.step_index if step_index is None else step_index,
            timestamp=utcnow(),
            agent_name=st.agent_name,
            conversation_id=st.conversation_id,
            parent_run_id=st.parent_run_id,
            tool_name=tool_name,
            tool_call_id=tool_call_id,
            error=error,
            metadata=dict(self.metadata),
            idempotency_key=st.next_key(f'{kind.value}:{discriminator}'),
            seq=None,
        )

    async def _event(
        self,
        ctx: RunContext[Any],
        kind: EventKind,
        *,
        discriminator: str,
        step_index: int | None = None,
        error: str | None = None,
        defer: bool = False,
    ) -> None:
        event = self._new_event(kind, discriminator=discriminator, step_index=step_index, error=error)
        await self._write(ctx, event, defer=defer)

    async def _write(
        self,
        ctx: RunContext[Any],
        *writes: StepWrite,
        snapshot: ContinuableSnapshot | None = None,
        new_call: bool = False,
        defer: bool = False,
    ) -> list[StepWrite]:
        """Write events and ledger entries in order, then `snapshot`; returns the records as stored.

        Under a durable engine each write is its own durable operation. Otherwise the writes go to
        the store in one `apply_writes` call, already stamped (records are built just before they
        are written), after any deferred ones. With `defer=True` (a model request's completion, a
        tool call's end, the snapshot of a tool cycle that another model request follows) the
        writes travel with the run's next write instead, which saves round trips per step; a timer
        makes sure they are written within `DEFERRED_WRITE_DELAY` seconds whenever the event loop
        is free, so nothing waits longer while a model request or a slow hook is in progress.
        Writes of one run always reach the store in order.
        """
        st = self._run()
        if self._journaled(ctx):
            done = await self._write_journaled(ctx, st, writes, snapshot=snapshot, new_call=new_call)
            await self._announce(ctx, st)
            return done
        if defer and (snapshot is None or st.deferred_snapshot is None) and self._arm_flush(st):
            st.deferred.extend(writes)
            if snapshot is not None:
                st.deferred_snapshot = snapshot
            return list(writes)
        async with st.write_lock:
            if st.flush_timer is not None:
                st.flush_timer.cancel()
                st.flush_timer = None
            await self._apply(st, writes, snapshot)
        await self._announce(ctx, st)
        return list(writes)

    async def _apply(
        self, st: _RunState, writes: Sequence[StepWrite], snapshot: ContinuableSnapshot | None = None
    ) -> None:
        """The deferred writes and snapshot, then `writes` and `snapshot` (write lock held).

        One `apply_writes` call, or two when a deferred snapshot and `snapshot` both need writing.
        Snapshots written are queued for `_announce`. When it fails, the deferred writes and
        snapshot are put back to go with the next write (the error path's, say).
        """
        if st.deferred_snapshot is not None and snapshot is not None:
            await self._apply(st, ())
        deferred, st.deferred = st.deferred, []
        pending, st.deferred_snapshot = st.deferred_snapshot, None
        try:
            await apply_writes(self.store, [*deferred, *writes], snapshot=pending or snapshot)
        except BaseException:
            st.deferred[:0] = deferred
            st.deferred_snapshot = pending
            raise
        st.unannounced.extend(s for s in (pending, snapshot) if s is not None)

    async def _announce(self, ctx: RunContext[Any], st: _RunState) -> None:
        """Emit `SnapshotSaved` for every snapshot written since the last announcement, in order."""
        while st.unannounced:
            snapshot = st.unannounced.pop(0)
            event = SnapshotSaved(
                persistence_run_id=st.run_id,
                conversation_id=st.conversation_id,
                step_index=snapshot.step_index,
                state=snapshot.state,
            )
            try:
                await ctx.emit(event)
            except UserError:
                # Only a context without an event stream refuses emission; the write itself stands.
                if ctx._event_stream_buffer is not None:  # pyright: ignore[reportPrivateUsage]
                    raise

    async def _write_journaled(
        self,
        ctx: RunContext[Any],
        st: _RunState,
        writes: Sequence[StepWrite],
        *,
        snapshot: ContinuableSnapshot | None,
        new_call: bool,
    ) -> list[StepWrite]:
        done: list[StepWrite] = []
        deferred, st.deferred = st.deferred, []
        for write in [*deferred, *writes]:
            if isinstance(write, StepEvent):
                await self._op_append_event(ctx, write)
                done.append(write)
            elif write.status is ToolEffectStatus.STARTED:
                done.append(await self._op_tool_effect_started(ctx, write, new_call))
            else:
                done.append(await self._op_tool_effect_finished(ctx, write))
        if snapshot is not None:
            await self._op_save_snapshot(ctx, snapshot)
            st.unannounced.append(snapshot)
        return done[len(deferred) :]

    def _arm_flush(self, st: _RunState) -> bool:
        """Make sure deferred writes are flushed soon; False when that cannot be scheduled (no asyncio loop)."""
        if st.flush_timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return False
            st.flush_timer = loop.call_later(DEFERRED_WRITE_DELAY, self._flush_soon, st)
        return True

    def _flush_soon(self, st: _RunState) -> None:
        st.flush_timer = None
        if st.deferred or st.deferred_snapshot is not None:
            task = asyncio.get_running_loop().create_task(self._flush_in_background(st))
            st.flush_tasks.add(task)
            task.add_done_callback(st.flush_tasks.discard)

    async def _flush_in_background(self, st: _RunState) -> None:
        async with st.write_lock:
            pending = len(st.deferred) + (st.deferred_snapshot is not None)
            if not pending:
                return
            try:
                await self._apply(st, ())
            except Exception as error:
                logger.warning(
                    "StepPersistence could not write %d record(s) of run %r yet (%s); the run's next write retries",
                    pending,
                    st.run_id,
                    _describe(error),
                )

    async def _save(
        self,
        ctx: RunContext[Any],
        messages: list[ModelMessage],
        state: SnapshotState,
        *,
        step_index: int | None = None,
        defer: bool = False,
    ) -> None:
        """Save `messages` as a snapshot; `SnapshotSaved` is emitted once it is written.

        With `defer=True` the snapshot travels with the run's next write (see `_write`) and is
        encoded then, so a request pydantic-ai stamps for sending in the meantime is stored once,
        as sent, instead of unstamped now and again stamped at the next save.
        """
        st = self._run()
        st.save_seq += 1
        step = st.step_index if step_index is None else step_index
        # Built from values of known types: validating the whole history again at every save is skipped.
        snapshot = ContinuableSnapshot.model_construct(
            run_id=st.run_id,
            step_index=step,
            messages=messages,
            state=state,
            created_at=utcnow(),
            agent_name=st.agent_name,
            conversation_id=st.conversation_id,
            parent_run_id=st.parent_run_id,
            metadata=dict(self.metadata),
            idempotency_key=f'snapshot:{st.save_seq}:{step}:{state.value}',
        )
        await self._write(ctx, snapshot=snapshot, defer=defer)
        st.content.update(messages, encode_tail=not defer)

    def _state_of(self, messages: Sequence[ModelMessage]) -> SnapshotState:
        settled = self._run().settled.is_provider_valid(messages)
        return SnapshotState.COMPLETE if settled else SnapshotState.INTERRUPTED

    def _observe(self, ctx: RunContext[Any]) -> _RunState:
        st = self._run()
        st.step_index = ctx.run_step
        st.live = ctx.messages
        return st

    # --- run lifecycle -------------------------------------------------------------------------

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        token = _ACTIVE_RUN_ID.set(self._run().run_id)
        try:
            return await handler()
        finally:
            _ACTIVE_RUN_ID.reset(token)

    async def before_run(self, ctx: RunContext[AgentDepsT]) -> None:
        st = self._run()
        identity = await self._op_registration_identity(ctx)
        record = RunRecord(
            run_id=st.run_id,
            agent_name=st.agent_name,
            conversation_id=st.conversation_id,
            parent_run_id=st.parent_run_id,
            started_at=identity.started_at,
            metadata=dict(self.metadata),
            registration_id=identity.registration_id,
        )
        await self._op_register_run(ctx, record)
        await self._event(ctx, EventKind.RUN_STARTED, discriminator='run')

    async def after_run(self, ctx: RunContext[AgentDepsT], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        st = self._run()
        final = list(result.all_messages())
        if final and st.content.differs(final):
            await self._save(ctx, final, self._state_of(final))
        await self._event(ctx, EventKind.RUN_COMPLETED, discriminator='run')
        return result

    async def on_run_error(self, ctx: RunContext[AgentDepsT], *, error: BaseException) -> AgentRunResult[Any]:
        st = self._run()
        try:
            live = st.live
            if live is not None and any(isinstance(m, ModelResponse) for m in live):
                messages = list(live)
                await self._save(ctx, messages, self._state_of(messages))
            await self._event(ctx, EventKind.RUN_FAILED, discriminator='run', error=_describe(error))
        except Exception as store_error:
            error.add_note(f'StepPersistence could not record the failure: {_describe(store_error)}')
        raise error

    # --- node lifecycle ------------------------------------------------------------------------

    async def before_node_run(
        self, ctx: RunContext[AgentDepsT], *, node: AgentNode[AgentDepsT]
    ) -> AgentNode[AgentDepsT]:
        st = self._observe(ctx)
        if self.capture_frontier and isinstance(node, CallToolsNode):
            response = node.model_response
            if any(isinstance(part, ToolCallPart) for part in response.parts):
                messages = list(ctx.messages)
                if not messages or messages[-1] is not response:
                    messages.append(response)
                if st.content.differs(messages):
                    await self._save(ctx, messages, SnapshotState.INTERRUPTED)
        return node

    async def after_node_run(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        node: AgentNode[AgentDepsT],
        result: NodeResult[AgentDepsT],
    ) -> NodeResult[AgentDepsT]:
        st = self._observe(ctx)
        if isinstance(node, CallToolsNode):
            if isinstance(result, ModelRequestNode):
                # The tool returns are not in the live history yet: fold them into a new list.
                request = result.request  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
                messages: list[ModelMessage] = [*ctx.messages, cast(ModelMessage, request)]
            else:
                messages = list(ctx.messages)
            if any(isinstance(m, ModelResponse) for m in messages) and st.settled.is_provider_valid(messages):
                # Before another model request the snapshot goes with that request's started event.
                await self._save(ctx, messages, SnapshotState.COMPLETE, defer=isinstance(result, ModelRequestNode))
        return result

    # --- model requests ------------------------------------------------------------------------

    async def before_model_request(
        self, ctx: RunContext[AgentDepsT], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        st = self._observe(ctx)
        await self._event(ctx, EventKind.MODEL_REQUEST_STARTED, discriminator=str(ctx.run_step))
        if self.capture_frontier:
            messages = list(ctx.messages)
            # The request folded into the last boundary snapshot, now stamped for sending, is not new.
            if messages and not st.content.same_objects(messages) and st.content.differs(messages):
                await self._save(ctx, messages, SnapshotState.INTERRUPTED)
        return request_context

    async def after_model_request(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        self._observe(ctx)
        await self._event(ctx, EventKind.MODEL_REQUEST_COMPLETED, discriminator=str(ctx.run_step), defer=True)
        return response

    async def on_model_request_error(
        self, ctx: RunContext[AgentDepsT], *, request_context: ModelRequestContext, error: Exception
    ) -> ModelResponse:
        self._observe(ctx)
        await self._event(ctx, EventKind.MODEL_REQUEST_FAILED, discriminator=str(ctx.run_step), error=_describe(error))
        raise error

    # --- tool calls ----------------------------------------------------------------------------

    async def wrap_tool_execute(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        st = self._observe(ctx)
        call_id = call.tool_call_id
        now = utcnow()
        record = ToolEffectRecord(
            run_id=st.run_id,
            tool_call_id=call_id,
            tool_name=call.tool_name,
            status=ToolEffectStatus.STARTED,
            started_at=now,
            updated_at=now,
            step_index=ctx.run_step,
            args=call.args_as_dict(),
        )
        event = self._new_event(
            EventKind.TOOL_CALL_STARTED, discriminator=call_id, tool_name=call.tool_name, tool_call_id=call_id
        )
        stored, _ = await self._write(ctx, record, event, new_call=True)
        st.in_flight[call_id] = cast(ToolEffectRecord, stored)
        token = _ACTIVE_TOOL_CALL.set(ActiveToolCall(capability=self, run_id=st.run_id, tool_call_id=call_id))
        try:
            result = await handler(args)
        except Exception as error:
            _ACTIVE_TOOL_CALL.reset(token)
            await self._finish_tool(ctx, call, ToolEffectStatus.FAILED, error=_describe(error))
            raise
        _ACTIVE_TOOL_CALL.reset(token)
        await self._finish_tool(ctx, call, ToolEffectStatus.COMPLETED)
        return result

    async def _finish_tool(
        self, ctx: RunContext[Any], call: ToolCallPart, status: ToolEffectStatus, *, error: str | None = None
    ) -> None:
        st = self._run()
        call_id = call.tool_call_id
        current = st.in_flight.pop(call_id)
        finished = current.model_copy(update={'status': status, 'error': error, 'updated_at': utcnow()})
        kind = EventKind.TOOL_CALL_COMPLETED if status is ToolEffectStatus.COMPLETED else EventKind.TOOL_CALL_FAILED
        event = self._new_event(
            kind, discriminator=call_id, tool_name=call.tool_name, tool_call_id=call_id, error=error
        )
        await self._write(ctx, finished, event, defer=True)

    async def annotate(
        self,
        ctx: RunContext[Any],
        store: StepStore,
        tool_call_id: str,
        *,
        idempotency_key: str | None,
        effect_summary: str | None,
    ) -> None:
        """Merge annotations into the in-flight record of `tool_call_id` (see `annotate_tool_effect`)."""
        st = self._run()
        current = st.in_flight.get(tool_call_id)
        if current is None:
            return
        update: dict[str, Any] = {}
        if idempotency_key is not None:
            update['idempotency_key'] = idempotency_key
        if effect_summary is not None:
            update['effect_summary'] = effect_summary
        merged = current.model_copy(update=update)
        if store is self.store:
            (stored,) = await self._write(ctx, merged.model_copy(update={'updated_at': utcnow()}))
            st.in_flight[tool_call_id] = cast(ToolEffectRecord, stored)
        else:
            st.in_flight[tool_call_id] = merged
            await store.record_tool_effect(merged.model_copy(update={'updated_at': utcnow()}))
