# pyright: reportPossiblyUnboundVariable=false
# (the OpenTelemetry names are read only where `otel_api` says they were imported)
"""OpenTelemetry spans and metrics: what stepcore tells an operator's tracing backend about its writes,
its recoveries and its fleet.

All of stepcore's OpenTelemetry code is here. The rest of the package calls a few small functions at
its boundaries (a store write, a claim, a recovery, an orphan picked up, a cancel, a fenced write, a
damaged record, an approval answered or expired); docs/observability.md lists what each emits.

- Spans are started under whatever span is current, so a write made from a hook of an instrumented
  agent (`agent.instrument = True`, `Agent.instrument_all()`, Logfire) sits under pydantic-ai's run,
  model request or tool span.
- Attributes use OpenTelemetry's semantic conventions where one exists (`db.system.name`,
  `db.operation.name`, `error.type`) and `stepcore.` names otherwise. Nothing of a run's content goes
  out: no prompt, message, tool argument or result, and no exception message (those may quote them):
  a failure is told by its type (`error.type`).
- The tracer, the meter and every instrument are made once, at import, through the API's global
  providers: they forward to the SDK's once the application sets one, whenever it does.
- Cost: the write path is hot, so each function first asks `_on()`, which compares the API's two
  global provider variables with the ones it last decided on (two reads) and decides again only when
  one changed. Until an application sets a real provider every function returns at once; a provider
  set later is picked up at the next call.
- Without the `opentelemetry` package (`pip install "stepcore[otel]"` brings the API) every function
  does nothing.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextvars import Token
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, ParamSpec, Protocol, Self, TypeVar, cast

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse

from stepcore.common.version import VERSION

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.metrics import _internal as metric_globals
except ImportError:  # no OpenTelemetry API: every function here does nothing (and reads none of these names)
    otel_api = False
else:
    otel_api = True

__all__ = (
    'DB_OPERATION',
    'DB_SYSTEM',
    'ERROR_TYPE',
    'JOB_ID',
    'OUTCOME',
    'RUN_ID',
    'TOOL_CALL_ID',
    'TOOL_NAME',
    'OrphanWatch',
    'approval_answered',
    'approval_expired',
    'backend_name',
    'cancelling',
    'claiming',
    'damaged_record',
    'enabled',
    'fenced_write',
    'lease_opened',
    'recovering_orphan',
    'store_write',
    'traced_resolution',
)

P = ParamSpec('P')
T = TypeVar('T')

# --- attribute names ---------------------------------------------------------------------------------

DB_SYSTEM: Final = 'db.system.name'
DB_OPERATION: Final = 'db.operation.name'
ERROR_TYPE: Final = 'error.type'
RUN_ID: Final = 'stepcore.run_id'
JOB_ID: Final = 'stepcore.job_id'
"""The job a run belongs to: the first run of its chain of resumptions (its lease's `origin`, the
`origin` of its fencing tokens; the job id of `start_job`)."""
TOOL_NAME: Final = 'stepcore.tool_name'
TOOL_CALL_ID: Final = 'stepcore.tool_call_id'
OUTCOME: Final = 'stepcore.outcome'
_RECORDS: Final = 'stepcore.write.records'
_BYTES: Final = 'stepcore.write.bytes'
_SNAPSHOT_STATE: Final = 'stepcore.snapshot.state'
_EPOCH: Final = 'stepcore.lease.epoch'
_HELD_EPOCH: Final = 'stepcore.lease.held_epoch'
_RESOLVED_RUN: Final = 'stepcore.resolved_run_id'
_RESUMED_AS: Final = 'stepcore.resumed_as'
_OWNERSHIP: Final = 'stepcore.ownership'
_ACTION: Final = 'stepcore.claim.action'
_FORCED: Final = 'stepcore.claim.forced'
_ORPHAN_REASON: Final = 'stepcore.orphan.reason'
_RECORD: Final = 'stepcore.record'
_DAMAGE_KIND: Final = 'stepcore.damage.kind'

_WRITE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_PICKUP_BUCKETS: Final = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

_REFUSALS: Final = {
    'RunDeadError': 'dead',
    'RunAbandonedError': 'abandoned',
    'RunClaimedError': 'taken',
    'RunOwnedError': 'owned',
    'RunCancelledError': 'cancelled',
    'RunFencedError': 'fenced',
}
"""What recovery's refusals say of a run, by the error's class (or a base class) name: told as the
span's outcome. `common` stands below the modules that define them, so they go by name."""

_BACKENDS: Final = {
    'InMemoryStepStore': 'memory',
    'SqliteStepStore': 'sqlite',
    'PostgresStepStore': 'postgresql',
    'MongoStepStore': 'mongodb',
    'RedisStepStore': 'redis',
    'FileStepStore': 'file',
}
"""`db.system.name` of stepcore's own stores (the semantic conventions' names where they have one)."""

# --- the switch ------------------------------------------------------------------------------------------

_UNSEEN: Final = object()


class _Switch:
    """Whether a real provider is set, as decided on the API's global provider variables last seen."""

    __slots__ = ('meter_provider', 'metering', 'on', 'tracer_provider', 'tracing')

    def __init__(self) -> None:
        self.tracer_provider: object = _UNSEEN
        self.meter_provider: object = _UNSEEN
        self.tracing = False
        self.metering = False
        self.on = False


_SWITCH: Final = _Switch()
_GLOBALS_READABLE = otel_api and hasattr(otel_trace, '_TRACER_PROVIDER') and hasattr(metric_globals, '_METER_PROVIDER')
"""Whether this API keeps its providers in the module variables `_on` compares (the releases stepcore
supports, 1.28 on, do); when not, the decision is taken again through the public getters at each call."""
_UNSET_METERS: Final[tuple[type, ...]] = (
    (otel_metrics.NoOpMeterProvider, getattr(metric_globals, '_ProxyMeterProvider', otel_metrics.NoOpMeterProvider))
    if otel_api
    else ()
)
"""The meter providers that record nothing: the API's no-op one, and its stand-in until one is set."""


def _decide() -> None:
    """Decide again, through the public getters (which also load a provider named by the
    `OTEL_PYTHON_TRACER_PROVIDER` / `OTEL_PYTHON_METER_PROVIDER` variables)."""
    tracer_provider = otel_trace.get_tracer_provider()
    meter_provider = otel_metrics.get_meter_provider()
    _SWITCH.tracing = not isinstance(tracer_provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider)
    _SWITCH.metering = not isinstance(meter_provider, _UNSET_METERS)
    _SWITCH.on = _SWITCH.tracing or _SWITCH.metering
    if _GLOBALS_READABLE:
        _SWITCH.tracer_provider = otel_trace._TRACER_PROVIDER
        _SWITCH.meter_provider = metric_globals._METER_PROVIDER


def _on() -> bool:
    """Whether a real tracer or meter provider is set: two reads while nothing changed."""
    if not otel_api:
        return False
    if (
        not _GLOBALS_READABLE
        or otel_trace._TRACER_PROVIDER is not _SWITCH.tracer_provider
        or metric_globals._METER_PROVIDER is not _SWITCH.meter_provider
    ):
        _decide()
    return _SWITCH.on


def enabled() -> bool:
    """Whether stepcore emits anything now: the application set an SDK tracer or meter provider."""
    return _on()


# --- the tracer, the meter and the instruments, made once ---------------------------------------------------


def _utcnow() -> datetime:
    return datetime.now(UTC)


class _Instruments:
    """The tracer and every instrument, made through the API's global providers."""

    def __init__(self) -> None:
        self.tracer = otel_trace.get_tracer('stepcore', VERSION)
        meter = otel_metrics.get_meter('stepcore', VERSION)
        self.writes = meter.create_counter(
            'stepcore.store.writes', unit='{write}', description='Writes of records to a step store (one batch each)'
        )
        self.write_duration = meter.create_histogram(
            'stepcore.store.write.duration',
            unit='s',
            description='How long a write of records to a step store took',
            explicit_bucket_boundaries_advisory=_WRITE_BUCKETS,
        )
        self.write_bytes = meter.create_counter(
            'stepcore.store.write.bytes',
            unit='By',
            description="JSON bytes of the records and new messages written (before a store's own framing)",
        )
        self.fenced = meter.create_counter(
            'stepcore.store.fenced_writes',
            unit='{write}',
            description='Writes a store refused because the run changed hands (a zombie fenced)',
        )
        self.damaged = meter.create_counter(
            'stepcore.records.damaged', unit='{record}', description='Stored records found damaged when read'
        )
        self.claims = meter.create_counter(
            'stepcore.claims', unit='{claim}', description='Takeovers of a run for recovery, won or lost'
        )
        self.resumptions = meter.create_counter(
            'stepcore.resumptions', unit='{run}', description='Runs resolved and handed on to be resumed'
        )
        self.dead = meter.create_counter(
            'stepcore.runs.dead', unit='{run}', description='Runs set dead: too many of their resumptions died'
        )
        self.orphans_listed = meter.create_counter(
            'stepcore.orphans.listed', unit='{run}', description='Orphans a recovery loop listed (each once)'
        )
        self.pickup = meter.create_histogram(
            'stepcore.orphans.pickup.duration',
            unit='s',
            description='From an orphan first listed by a recovery loop to its claim',
            explicit_bucket_boundaries_advisory=_PICKUP_BUCKETS,
        )
        self.answered = meter.create_counter(
            'stepcore.approvals.answered', unit='{answer}', description='Answers recorded to deferred tool calls'
        )
        self.expired = meter.create_counter(
            'stepcore.approvals.expired', unit='{answer}', description='Deferred tool calls expired unanswered'
        )
        meter.create_observable_gauge(
            'stepcore.orphans.waiting',
            callbacks=[functools.partial(_observe, orphans=True, age=False)],
            unit='{run}',
            description="Orphans in a recovery loop's last listing",
        )
        meter.create_observable_gauge(
            'stepcore.orphans.oldest_age',
            callbacks=[functools.partial(_observe, orphans=True, age=True)],
            unit='s',
            description="Seconds since the lease of the oldest orphan in a recovery loop's last listing expired",
        )
        meter.create_observable_gauge(
            'stepcore.runs.waiting',
            callbacks=[functools.partial(_observe, orphans=False, age=False)],
            unit='{run}',
            description='Runs paused on deferred tool calls, waiting for answers, as a recovery loop last saw them',
        )
        meter.create_observable_gauge(
            'stepcore.runs.waiting.oldest_age',
            callbacks=[functools.partial(_observe, orphans=False, age=True)],
            unit='s',
            description='Seconds the longest waiting run has waited for answers',
        )


# --- the shapes of what callers hand over (the classes stand in layers above) -------------------------------


class _Snapshot(Protocol):
    @property
    def messages(self) -> Sequence[ModelMessage]: ...

    @property
    def state(self) -> object: ...


class _Lease(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    @property
    def origin(self) -> str | None: ...

    @property
    def expires_at(self) -> datetime: ...


class _Claim(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    @property
    def origin(self) -> str: ...


class _Call(Protocol):
    @property
    def tool_call_id(self) -> str: ...

    @property
    def tool_name(self) -> str: ...


class _Settled(_Call, Protocol):
    @property
    def how(self) -> str: ...


class _Resumption(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def settled(self) -> Sequence[_Settled]: ...

    @property
    def pending(self) -> Sequence[_Call]: ...

    @property
    def waiting(self) -> Sequence[_Call]: ...

    @property
    def finished(self) -> bool: ...

    @property
    def ownership(self) -> str: ...

    @property
    def claim(self) -> _Claim | None: ...


class _Orphan(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def why(self) -> str: ...

    @property
    def lease(self) -> _Lease: ...


class _Outcome(Protocol):
    @property
    def outcome(self) -> str: ...

    @property
    def resumed_as(self) -> str | None: ...

    @property
    def claimed_at(self) -> datetime | None: ...


class _Waiting(Protocol):
    @property
    def paused_at(self) -> datetime: ...


ClaimT = TypeVar('ClaimT', bound=_Claim)
OutcomeT = TypeVar('OutcomeT', bound=_Outcome)
LeaseT = TypeVar('LeaseT', bound=_Lease)
ResumptionT = TypeVar('ResumptionT', bound=_Resumption)

# --- small helpers -------------------------------------------------------------------------------------


_NAMES: dict[type, str] = {}


def backend_name(store: object) -> str:
    """`db.system.name` of a store: the conventions' name of its database for stepcore's own stores
    (`sqlite`, `postgresql`, `mongodb`, `redis`; `memory`, `file`), else its class name; a store
    written to the protocol alone is named by its own class, not by the wrapper around it."""
    inner: object = getattr(store, 'inner', None) if type(store).__name__ == 'ProtocolStore' else None
    cls: type = type(inner if inner is not None else store)
    name = _NAMES.get(cls)
    if name is None:
        name = next((_BACKENDS[c.__name__] for c in cls.__mro__ if c.__name__ in _BACKENDS), cls.__name__)
        _NAMES[cls] = name
    return name


def _error_type(error: BaseException) -> str:
    """`error.type`: the exception's fully qualified class name (never its message)."""
    cls = type(error)
    return cls.__qualname__ if cls.__module__ == 'builtins' else f'{cls.__module__}.{cls.__qualname__}'


def _refusal(error: BaseException) -> str:
    """What a recovery's error says of the run: a refusal's name, or `error`."""
    for cls in type(error).__mro__:
        if (said := _REFUSALS.get(cls.__name__)) is not None:
            return said
    return 'nothing to resume' if isinstance(error, LookupError) else 'error'


_JOBS: OrderedDict[str, str] = OrderedDict()
_JOBS_KEPT: Final = 4096


def _note_job(run_id: str, job: str | None) -> None:
    """Remember a run's job (its chain's origin) for its write spans: the newest few thousand runs."""
    if job is None:
        return
    _JOBS[run_id] = job
    if len(_JOBS) > _JOBS_KEPT:
        _JOBS.popitem(last=False)


_SAVED: OrderedDict[str, int] = OrderedDict()
"""How many messages the newest snapshot of a run written here held (for the bytes of the next one)."""


def _payload(run_id: str, batch: Sequence[object], snapshot: _Snapshot | None) -> int:
    """JSON bytes of the records of `batch` and of the messages `snapshot` adds to the previous snapshot
    of the run written by this process (the whole history for the first, or after a rewrite): what
    the store writes, before its own framing, checksums and compression."""
    size = 0
    for record in batch:
        serializer = getattr(type(record), '__pydantic_serializer__', None)
        if serializer is not None:
            size += len(serializer.to_json(record))
    if snapshot is not None:
        messages = snapshot.messages
        before = _SAVED.pop(run_id, 0)
        _SAVED[run_id] = len(messages)
        if len(_SAVED) > _JOBS_KEPT:
            _SAVED.popitem(last=False)
        for message in messages[before:] if before <= len(messages) else messages:
            size += len(_message_adapter(type(message)).dump_json([message])) - 2  # less the brackets
    return size


@functools.cache
def _message_adapter(kind: type) -> TypeAdapter[list[Any]]:
    """How a message of `kind` is serialized: a request or response adapter (a third of the work of
    pydantic-ai's union of both), the union for anything else; each built once, when first needed."""
    if kind is ModelRequest:
        return TypeAdapter(list[ModelRequest])
    if kind is ModelResponse:
        return TypeAdapter(list[ModelResponse])
    return TypeAdapter(list[ModelMessage])


def _current_span_event(name: str, attributes: Mapping[str, str | int | bool]) -> None:
    span = otel_trace.get_current_span()
    if span.is_recording():
        span.add_event(name, attributes)


# --- spans ----------------------------------------------------------------------------------------------


class _Block:
    """A span current while a `with` block runs (when tracing is on), ended with it; an error leaving the
    block is told by its type. Built only while `_on()`; `_OFF` stands for it otherwise."""

    __slots__ = ('_attributes', '_kind', '_name', '_span', '_token')

    def __init__(self, name: str, attributes: dict[str, Any], *, client: bool = False) -> None:
        self._name = name
        self._attributes = attributes
        self._kind = client
        self._span: otel_trace.Span | None = None
        self._token: Token[otel_context.Context] | None = None

    def __enter__(self) -> Self:
        if _SWITCH.tracing:
            kind = otel_trace.SpanKind.CLIENT if self._kind else otel_trace.SpanKind.INTERNAL
            self._span = span = _INSTRUMENTS.tracer.start_span(self._name, kind=kind, attributes=self._attributes)
            self._token = otel_context.attach(otel_trace.set_span_in_context(span))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.ended(error)
        span = self._span
        if span is None:
            return
        if error is not None:
            span.set_attribute(ERROR_TYPE, _error_type(error))
            span.set_status(otel_trace.StatusCode.ERROR)
        if self._token is not None:
            otel_context.detach(self._token)
        span.end()

    def ended(self, error: BaseException | None) -> None:
        """What a kind of block records when it ends (its metrics), before its span ends."""

    def set(self, key: str, value: str | int | bool | None) -> None:
        if self._span is not None and value is not None:
            self._span.set_attribute(key, value)

    def event(self, name: str, attributes: Mapping[str, str | int | bool]) -> None:
        if self._span is not None:
            self._span.add_event(name, attributes)


class _Off:
    """What every function hands out while nothing is emitted: a block doing nothing."""

    __slots__ = ()

    def __enter__(self) -> _Off:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        return None

    def won(self, claim: ClaimT) -> ClaimT:
        return claim

    def done(self, found: T) -> T:
        return found

    def written(self, step: Any = None, size: Callable[[Any], int | None] | None = None) -> None:
        return None


_OFF: Final = _Off()


class _Write(_Block):
    __slots__ = ('_backend', '_batch', '_bytes', '_run_id', '_snapshot', '_started')

    def __init__(self, store: object, run_id: str, batch: Sequence[object], snapshot: _Snapshot | None) -> None:
        self._backend = backend_name(store)
        self._run_id = run_id
        self._batch = batch
        self._snapshot = snapshot
        self._bytes: int | None = None
        attributes: dict[str, Any] = {
            DB_SYSTEM: self._backend,
            DB_OPERATION: 'write_batch',
            RUN_ID: run_id,
            _RECORDS: len(batch) + (snapshot is not None),
        }
        if (job := _JOBS.get(run_id)) is not None:
            attributes[JOB_ID] = job
        if snapshot is not None:
            attributes[_SNAPSHOT_STATE] = str(getattr(snapshot.state, 'value', snapshot.state))
        super().__init__('stepcore.write', attributes, client=True)
        self._started = time.perf_counter()

    def written(self, step: Any = None, size: Callable[[Any], int | None] | None = None) -> None:
        """The write went through: `step` is what the engine wrote and `size` tells its bytes (its
        sealed bodies); without them (a store of its own), the bytes are those of the records and new
        messages as JSON."""
        sealed = size(step) if size is not None else None
        self._bytes = sealed if sealed is not None else _payload(self._run_id, self._batch, self._snapshot)
        self.set(_BYTES, self._bytes)

    def ended(self, error: BaseException | None) -> None:
        if not _SWITCH.metering:
            return
        attributes = {DB_SYSTEM: self._backend}
        if error is not None:
            attributes[ERROR_TYPE] = _error_type(error)
        elif self._bytes is not None:
            _INSTRUMENTS.write_bytes.add(self._bytes, attributes)
        _INSTRUMENTS.writes.add(1, attributes)
        _INSTRUMENTS.write_duration.record(time.perf_counter() - self._started, attributes)


def store_write(store: object, run_id: str, batch: Sequence[object], snapshot: _Snapshot | None) -> _Write | _Off:
    """`with` around one write of a run's records (`batch`, after `snapshot`) to `store`: the span
    `stepcore.write` and the write metrics. The capability's writer calls it for each batch."""
    if (
        _GLOBALS_READABLE
        and otel_trace._TRACER_PROVIDER is _SWITCH.tracer_provider
        and metric_globals._METER_PROVIDER is _SWITCH.meter_provider
        and not _SWITCH.on
    ):
        return _OFF  # `_on()` written out: this runs at every write, and nothing listens
    if not _on():
        return _OFF
    return _Write(store, run_id, batch, snapshot)


def fenced_write(store: object, run_id: str, epoch: int | None, lease: _Lease | None) -> None:
    """A write of `run_id` at lease `epoch` that `store` refused: the run changed hands (a zombie was
    fenced). An event on the current span (the write's) and the fenced-writes count."""
    if not _on():
        return
    if _SWITCH.tracing:
        attributes: dict[str, str | int | bool] = {RUN_ID: run_id}
        if epoch is not None:
            attributes[_HELD_EPOCH] = epoch
        if lease is not None:
            attributes[_EPOCH] = lease.epoch
            if lease.origin is not None:
                attributes[JOB_ID] = lease.origin
        _current_span_event('stepcore.write.fenced', attributes)
    if _SWITCH.metering:
        _INSTRUMENTS.fenced.add(1, {DB_SYSTEM: backend_name(store)})


def damaged_record(run_id: str | None, record: str, kind: str) -> None:
    """A stored record found damaged (`DamagedRecordError` built): an event on the current span and
    the damaged-records count. `record` names the record (its kind and key), never its content."""
    if not _on():
        return
    if _SWITCH.tracing:
        attributes: dict[str, str | int | bool] = {_RECORD: record, _DAMAGE_KIND: kind}
        if run_id is not None:
            attributes[RUN_ID] = run_id
        _current_span_event('stepcore.record.damaged', attributes)
    if _SWITCH.metering:
        _INSTRUMENTS.damaged.add(1, {_DAMAGE_KIND: kind})


def lease_opened(run_id: str, origin: str | None) -> None:
    """A run took its lease: its job (`origin`) is remembered for the spans of its writes."""
    if _on():
        _note_job(run_id, origin)


# --- claims -------------------------------------------------------------------------------------------------


class _Claiming(_Block):
    __slots__ = ('_backend',)

    def __init__(self, store: object, run_id: str, action: str, force: bool) -> None:
        self._backend = backend_name(store)
        attributes = {DB_SYSTEM: self._backend, RUN_ID: run_id, _ACTION: action, _FORCED: force}
        super().__init__('stepcore.claim', attributes)

    def won(self, claim: ClaimT) -> ClaimT:
        """The claim this block made: told, then handed back."""
        _note_job(claim.run_id, claim.origin)
        self.set(OUTCOME, 'won')
        self.set(_EPOCH, claim.epoch)
        self.set(JOB_ID, claim.origin)
        return claim

    def ended(self, error: BaseException | None) -> None:
        if error is None:
            outcome = 'won'
        else:
            outcome = 'lost' if _refusal(error) in ('taken', 'owned', 'cancelled') else 'error'
            self.set(OUTCOME, outcome)
        if _SWITCH.metering:
            _INSTRUMENTS.claims.add(1, {DB_SYSTEM: self._backend, OUTCOME: outcome})


def claiming(store: object, run_id: str, *, action: str, force: bool) -> _Claiming | _Off:
    """`with` around a takeover of `run_id` for recovery: the span `stepcore.claim` and the claims count
    (`won`, or `lost` when the block raises a refusal). `.won(claim)` tells the claim and hands it back."""
    if not _on():
        return _OFF
    return _Claiming(store, run_id, action, force)


# --- recovery ---------------------------------------------------------------------------------------------


def _tell_resolution(block: _Block, backend: str, resumption: _Resumption) -> None:
    """The outcome of a `resolve_run` and, as events, how each call of the cut cycle was settled."""
    if resumption.finished:
        outcome = 'finished'
    elif resumption.waiting:
        outcome = 'waiting'
    elif resumption.pending:
        outcome = 'pending'
    else:
        outcome = 'ready'
    block.set(OUTCOME, outcome)
    block.set(_RESOLVED_RUN, resumption.run_id)
    block.set(_OWNERSHIP, resumption.ownership)
    claim = resumption.claim
    block.set(JOB_ID, claim.origin if claim is not None else _JOBS.get(resumption.run_id))
    for settled in resumption.settled:
        block.event(
            'stepcore.settlement',
            {TOOL_CALL_ID: settled.tool_call_id, TOOL_NAME: settled.tool_name, OUTCOME: settled.how},
        )
    for left, said in ((resumption.pending, 'pending'), (resumption.waiting, 'waiting')):
        for call in left:
            block.event(
                'stepcore.settlement', {TOOL_CALL_ID: call.tool_call_id, TOOL_NAME: call.tool_name, OUTCOME: said}
            )
    if outcome == 'ready' and _SWITCH.metering:
        _INSTRUMENTS.resumptions.add(1, {DB_SYSTEM: backend})


def traced_resolution(resolve: Callable[P, Awaitable[ResumptionT]]) -> Callable[P, Awaitable[ResumptionT]]:
    """`resolve_run`, in the span `stepcore.resolve`: the run asked about, the run resolved (its newest
    continuation), the outcome (`ready`, `finished`, `pending`, `waiting`, or the refusal: `dead`,
    `taken`, `owned`, `cancelled`, `abandoned`, `nothing to resume`), and one `stepcore.settlement`
    event per call of the cut cycle (its id, its tool, how it was settled). Counts resumptions made
    ready and runs set dead."""

    @functools.wraps(resolve)
    async def resolve_traced(*args: P.args, **kwargs: P.kwargs) -> ResumptionT:
        if not _on():
            return await resolve(*args, **kwargs)
        store = args[0] if args else kwargs.get('store')
        backend = backend_name(store)
        run_id = kwargs.get('run_id')
        attributes = {DB_SYSTEM: backend, RUN_ID: run_id if isinstance(run_id, str) else ''}
        with _Block('stepcore.resolve', attributes) as block:
            try:
                resumption = await resolve(*args, **kwargs)
            except BaseException as error:
                said = _refusal(error)
                block.set(OUTCOME, said)
                if said == 'dead' and _SWITCH.metering:
                    _INSTRUMENTS.dead.add(1, {DB_SYSTEM: backend})
                raise
            _tell_resolution(block, backend, resumption)
            return resumption

    return resolve_traced


class _Recovering(_Block):
    __slots__ = ('_backend', '_listed_at')

    def __init__(self, store: object, orphan: _Orphan, listed_at: datetime | None) -> None:
        self._backend = backend_name(store)
        self._listed_at = listed_at
        attributes: dict[str, Any] = {DB_SYSTEM: self._backend, RUN_ID: orphan.run_id, _ORPHAN_REASON: orphan.why}
        if orphan.lease.origin is not None:
            attributes[JOB_ID] = orphan.lease.origin
        super().__init__('stepcore.recover_orphan', attributes)

    def done(self, found: OutcomeT) -> OutcomeT:
        """What became of the orphan: told (and the time from its listing to its claim), then handed back."""
        self.set(OUTCOME, found.outcome)
        self.set(_RESUMED_AS, found.resumed_as)
        claimed_at = found.claimed_at
        if claimed_at is not None and self._listed_at is not None and _SWITCH.metering:
            waited = max((claimed_at - self._listed_at).total_seconds(), 0.0)
            _INSTRUMENTS.pickup.record(waited, {DB_SYSTEM: self._backend})
        return found


def recovering_orphan(store: object, orphan: _Orphan, listed_at: datetime | None) -> _Recovering | _Off:
    """`with` around what a recovery loop does with one orphan: the span `stepcore.recover_orphan`, and
    `.done(outcome)` tells the outcome and the time from `listed_at` (when a loop first listed it) to
    its claim."""
    if not _on():
        return _OFF
    return _Recovering(store, orphan, listed_at)


class _Cancelling(_Block):
    __slots__ = ()

    def done(self, lease: LeaseT) -> LeaseT:
        """The run's lease as the cancel left it: told, then handed back."""
        self.set(OUTCOME, 'cancelled')
        self.set(_RESOLVED_RUN, lease.run_id)
        self.set(_EPOCH, lease.epoch)
        self.set(JOB_ID, lease.origin)
        return lease


def cancelling(store: object, run_id: str) -> _Cancelling | _Off:
    """`with` around a cancel of `run_id`: the span `stepcore.cancel`; `.done(lease)` tells the run it
    cancelled (its newest continuation)."""
    if not _on():
        return _OFF
    return _Cancelling('stepcore.cancel', {DB_SYSTEM: backend_name(store), RUN_ID: run_id})


def approval_answered(decision: str) -> None:
    """An answer to a deferred tool call recorded (`approved`, `denied`, `result`, `failed`)."""
    if _on() and _SWITCH.metering:
        _INSTRUMENTS.answered.add(1, {OUTCOME: decision})


def approval_expired(run_id: str, call: _Call) -> None:
    """A deferred tool call's expiry recorded by this process: counted, and an event on the current span."""
    if not _on():
        return
    if _SWITCH.metering:
        _INSTRUMENTS.expired.add(1)
    if _SWITCH.tracing:
        attributes = {RUN_ID: run_id, TOOL_CALL_ID: call.tool_call_id, TOOL_NAME: call.tool_name}
        _current_span_event('stepcore.approval.expired', attributes)


# --- what a recovery loop lists, for the gauges ---------------------------------------------------------------


class OrphanWatch:
    """What one recovery loop (or one pass) listed: when it first saw each orphan (for the time to its
    claim), and the orphans and waiting runs its newest listing held (for the gauges)."""

    def __init__(self, store: object) -> None:
        self._store = store
        self._first: dict[str, datetime] = {}
        self.orphans: tuple[int, datetime | None] = (0, None)
        """How many orphans the newest listing held, and when the oldest one's lease expired."""
        self.waiting: tuple[int, datetime | None] = (0, None)
        """How many runs waited for answers at the newest look, and since when the longest waiting one."""
        _WATCHES.add(self)

    @property
    def backend(self) -> str:
        return backend_name(self._store)

    def listed(self, orphans: Sequence[_Orphan]) -> None:
        """The orphans a listing found (when each was first listed is kept with or without
        OpenTelemetry: the recovery loop reads it)."""
        now = _utcnow()
        first = {orphan.run_id: self._first.get(orphan.run_id, now) for orphan in orphans}
        new = len(first.keys() - self._first.keys())
        self._first = first
        if not otel_api:
            return
        self.orphans = (len(orphans), min((o.lease.expires_at for o in orphans), default=None))
        if new and _on() and _SWITCH.metering:
            _INSTRUMENTS.orphans_listed.add(new, {DB_SYSTEM: self.backend})

    def waiting_runs(self, runs: Sequence[_Waiting]) -> None:
        """The runs waiting for answers a loop's look at deadlines found."""
        if otel_api:
            self.waiting = (len(runs), min((run.paused_at for run in runs), default=None))

    def first_listed(self, run_id: str) -> datetime | None:
        """When this loop first listed `run_id` among the orphans it has listed since."""
        return self._first.get(run_id)


_WATCHES: weakref.WeakSet[OrphanWatch] = weakref.WeakSet()


def _seconds_since(then: datetime | None, now: datetime) -> float:
    return max((now - then).total_seconds(), 0.0) if then is not None else 0.0


def _observe(options: CallbackOptions, *, orphans: bool, age: bool) -> Iterator[Observation]:
    """One gauge's values: per backend, the most any live watch saw (several loops of one process on one
    store list the same runs)."""
    del options
    now = _utcnow()
    found: dict[str, float] = {}
    for watch in list(_WATCHES):
        count, oldest = watch.orphans if orphans else watch.waiting
        value = float(count) if not age else _seconds_since(oldest, now)
        found[watch.backend] = max(found.get(watch.backend, 0.0), value)
    for backend, value in found.items():
        yield Observation(value if age else int(value), {DB_SYSTEM: backend})


_INSTRUMENTS: Final = _Instruments() if otel_api else cast(_Instruments, None)
"""Made once; never read without the API (every function returns first)."""
