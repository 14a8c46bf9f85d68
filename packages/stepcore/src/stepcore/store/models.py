"""The records stepcore persists: runs, step events, snapshots and tool effects.

They are the reference's keyword-only dataclasses (`RunRecord`, `StepEvent`,
`ContinuableSnapshot`, `ToolEffectRecord`): the same field names, in the same order, with the same
defaults, then the fields stepcore adds. They are pydantic dataclasses, so a record is validated
when it is built (`dataclasses.replace` validates the copy too), and `==` compares every field but
the store-assigned `seq`.

The pydantic-style helpers stepcore 0.1's models had (`model_copy`, `model_dump`,
`model_dump_json`, `model_validate`, `model_construct`) are kept on them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Final, Literal, Self, cast

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_ai.messages import ModelMessage
from pydantic_core import SchemaSerializer, SchemaValidator

__all__ = (
    'RECORD_FORMAT_VERSION',
    'ContinuableSnapshot',
    'EventKind',
    'RunRecord',
    'SnapshotMessages',
    'SnapshotState',
    'SnapshotSummary',
    'StepEvent',
    'ToolEffectRecord',
    'ToolEffectStatus',
    'utcnow',
)

RECORD_FORMAT_VERSION = 2
"""Version of the stored record format. Readers refuse records stamped with a newer version.

1: compact JSON bodies. 2: a store's bodies carry a checksum or a ciphertext (`stepcore.engine`).
"""


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


_now: Final = partial(datetime.now, UTC)
"""`utcnow` as the records' default time: a C-level call, made for every record a step writes."""


def _no_metadata() -> dict[str, str]:
    return {}


class EventKind(StrEnum):
    """What happened at a step boundary (a `str`: `event.kind == 'run_started'` holds)."""

    RUN_STARTED = 'run_started'
    RUN_COMPLETED = 'run_completed'
    RUN_FAILED = 'run_failed'
    MODEL_REQUEST_STARTED = 'model_request_started'
    MODEL_REQUEST_COMPLETED = 'model_request_completed'
    MODEL_REQUEST_FAILED = 'model_request_failed'
    TOOL_CALL_STARTED = 'tool_call_started'
    TOOL_CALL_COMPLETED = 'tool_call_completed'
    TOOL_CALL_FAILED = 'tool_call_failed'


class SnapshotState(StrEnum):
    """Whether a snapshot's tool work was settled when it was captured."""

    COMPLETE = 'complete'
    """Every tool call has a matching result: safe to continue from."""
    INTERRUPTED = 'interrupted'
    """Tool work was unsettled (a crash or failure mid tool cycle): check the ledger first."""


class ToolEffectStatus(StrEnum):
    """Lifecycle of one tool call in the tool-effect ledger."""

    STARTED = 'started'
    COMPLETED = 'completed'
    FAILED = 'failed'


_RECORD_CONFIG = ConfigDict(extra='forbid', populate_by_name=True)
"""A record refuses a keyword it does not have, as a dataclass does (`model_validate`, which reads
stored records, leaves unknown keys out instead)."""


if TYPE_CHECKING:
    # A type checker sees the records as the plain dataclasses they are to a caller.
    from dataclasses import dataclass as _record_dataclass
else:

    def _record_dataclass(**options):
        return pydantic_dataclass(config=_RECORD_CONFIG, **options)


_ACCEPTED: dict[type, frozenset[str]] = {}


def _accepted_keys(cls: type) -> frozenset[str]:
    """The keys a record class takes: its field names and their validation aliases."""
    keys = _ACCEPTED.get(cls)
    if keys is None:
        found: set[str] = set()
        for name, info in getattr(cls, '__pydantic_fields__', {}).items():
            found.add(name)
            alias = info.validation_alias
            if isinstance(alias, AliasChoices):
                found.update(choice for choice in alias.choices if isinstance(choice, str))
        keys = _ACCEPTED[cls] = frozenset(found)
    return keys


class _RecordMethods:
    """What every record has beside its fields: stepcore 0.1's pydantic-style helpers."""

    __pydantic_serializer__: ClassVar[SchemaSerializer]
    __pydantic_validator__: ClassVar[SchemaValidator]

    @classmethod
    def model_validate(cls, data: Mapping[str, Any] | Self) -> Self:
        """A record from a mapping of its fields (as stored, or as `model_dump` gives them), validated.

        Keys the record does not have are left out, so a record written by a later release reads.
        """
        if isinstance(data, cls):
            return data
        fields = cast(Mapping[str, Any], data)
        keys = _accepted_keys(cls)
        if not keys.issuperset(fields):
            fields = {k: v for k, v in fields.items() if k in keys}
        return cls.__pydantic_validator__.validate_python(fields)

    @classmethod
    def model_validate_json(cls, data: str | bytes) -> Self:
        """`model_validate` of a JSON document."""
        return cls.model_validate(cast(dict[str, Any], json.loads(data)))

    @classmethod
    def model_construct(cls, **values: Any) -> Self:
        """A record from values of the right types, without validating them; missing fields take their defaults."""
        record = object.__new__(cls)
        names, specs = _CONSTRUCTION.get(cls) or _construction(cls)
        if not names <= values.keys():  # else every field is given: nothing to fill in
            for spec in specs:
                if spec.name in values:
                    continue
                if spec.default is not dataclasses.MISSING:
                    values[spec.name] = spec.default
                elif spec.default_factory is not dataclasses.MISSING:
                    values[spec.name] = spec.default_factory()
                else:
                    raise TypeError(f'{cls.__name__}.model_construct() needs {spec.name}=')
        record.__dict__.update(values)
        return record

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with the fields in `update` replaced, not validated (`dataclasses.replace` validates)."""
        if deep:
            duplicate = copy.deepcopy(self)
        elif type(self) in _PLAIN_RECORDS:
            # what `copy.copy` does for these classes (no `__copy__`, `__setstate__` or slots), without
            # its `__reduce_ex__` round trip
            duplicate = object.__new__(type(self))
            duplicate.__dict__.update(self.__dict__)
        else:
            duplicate = copy.copy(self)
        if update:
            duplicate.__dict__.update(update)
        return duplicate

    def model_dump(
        self,
        *,
        mode: Literal['python', 'json'] = 'python',
        include: set[str] | None = None,
        exclude: set[str] | None = None,
        by_alias: bool = False,
        exclude_none: bool = False,
    ) -> dict[str, Any]:
        """The record's fields as a dict (`mode='json'`: JSON-compatible values)."""
        return type(self).__pydantic_serializer__.to_python(
            self, mode=mode, include=include, exclude=exclude, by_alias=by_alias, exclude_none=exclude_none
        )

    def model_dump_json(self, *, exclude: set[str] | None = None, exclude_none: bool = False) -> str:
        """The record as a JSON string."""
        return type(self).__pydantic_serializer__.to_json(self, exclude=exclude, exclude_none=exclude_none).decode()


@_record_dataclass(kw_only=True)
class RunRecord(_RecordMethods):
    """One `Agent.run` call and its lineage.

    `conversation_id` groups the runs of one dialogue; `parent_run_id` names the run that started
    this one (delegation). The two are independent.
    """

    run_id: str
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    metadata: dict[str, str] = dataclasses.field(default_factory=_no_metadata)
    started_at: datetime = dataclasses.field(default_factory=_now)
    registration_id: str | None = None
    """Identity of the registration that created this record.

    A second `register_run` with the same `run_id` and the same `registration_id` is a retry of the
    same registration (durable replay) and is accepted; any other reuse raises `ValueError`.
    """


@_record_dataclass(kw_only=True)
class StepEvent(_RecordMethods):
    """An append-only record of one step boundary."""

    run_id: str
    kind: EventKind
    step_index: int
    timestamp: datetime = dataclasses.field(default_factory=_now)
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    error: str | None = None
    """A description of the failure, for `*_failed` events."""
    metadata: dict[str, str] = dataclasses.field(default_factory=_no_metadata)
    idempotency_key: str | None = None
    """A key the store already applied for this run is suppressed; `None` always appends."""
    seq: int | None = dataclasses.field(default=None, compare=False)
    """Position in the run's event trail, assigned by the store on append (not compared by `==`)."""


@_record_dataclass(kw_only=True)
class ContinuableSnapshot(_RecordMethods):
    """The message history of a run at one boundary, loadable as `message_history=`."""

    run_id: str
    step_index: int
    messages: list[ModelMessage]
    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    timestamp: Annotated[
        datetime, Field(validation_alias=AliasChoices('timestamp', 'created_at'), serialization_alias='created_at')
    ] = dataclasses.field(default_factory=_now)
    """When the snapshot was taken. Stored as `created_at`, the name stepcore 0.1 gave it, which
    the constructor still takes."""
    state: SnapshotState = SnapshotState.COMPLETE
    idempotency_key: str | None = None
    """A key the store already applied for this run is suppressed; `None` always saves."""
    metadata: dict[str, str] = dataclasses.field(default_factory=_no_metadata)
    seq: int | None = dataclasses.field(default=None, compare=False)
    """Per-run monotonic position, assigned by the store on save (not compared by `==`)."""

    @property
    def created_at(self) -> datetime:
        """`timestamp`, by the name stepcore 0.1 gave it."""
        return self.timestamp


@_record_dataclass(kw_only=True)
class ToolEffectRecord(_RecordMethods):
    """The ledger entry of one tool call, keyed by `(run_id, tool_call_id)`."""

    tool_call_id: str
    tool_name: str
    run_id: str
    status: ToolEffectStatus
    started_at: datetime = dataclasses.field(default_factory=_now)
    ended_at: datetime | None = None
    """When the call completed or failed; `None` while it is `started`."""
    idempotency_key: str | None = None
    """Set by the tool through `annotate_tool_effect`: how to deduplicate its side effect."""
    effect_summary: str | None = None
    """Set by the tool through `annotate_tool_effect`: what the side effect was, in words."""
    updated_at: datetime | None = None
    """When the entry was last written: its `ended_at`, else its `started_at`, unless given."""
    step_index: int = 0
    error: str | None = None
    args: Any = None
    """The tool call's arguments as the model sent them (JSON-compatible)."""

    def __post_init__(self) -> None:
        if self.updated_at is None:
            self.updated_at = self.ended_at if self.ended_at is not None else self.started_at

    @property
    def unresolved(self) -> bool:
        """True while the call has a `started` record and no terminal update."""
        return self.status is ToolEffectStatus.STARTED


_PLAIN_RECORDS: frozenset[type] = frozenset({RunRecord, StepEvent, ContinuableSnapshot, ToolEffectRecord})
"""The record classes themselves (not a subclass, which may copy itself its own way)."""

_CONSTRUCTION: dict[type, tuple[frozenset[str], tuple[dataclasses.Field[Any], ...]]] = {}


def _construction(cls: type) -> tuple[frozenset[str], tuple[dataclasses.Field[Any], ...]]:
    """A record class's field names and fields, for `model_construct` (found once per class)."""
    found = _CONSTRUCTION.get(cls)
    if found is None:
        specs = dataclasses.fields(cls)  # pyright: ignore[reportArgumentType]
        found = _CONSTRUCTION[cls] = (frozenset(spec.name for spec in specs), specs)
    return found


class SnapshotSummary(BaseModel):
    """What a snapshot is without its messages: enough to list a run's snapshots cheaply.

    `StepStore.list_snapshot_summaries` answers these without reading any message; load one
    snapshot in full with `StepStore.get_snapshot(run_id, seq)`.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    seq: int
    state: SnapshotState
    step_index: int
    message_count: int
    """How many messages the snapshot holds."""
    created_at: datetime
    agent_name: str | None = None
    conversation_id: str | None = None
    parent_run_id: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict[str, str])
    idempotency_key: str | None = None

    @classmethod
    def of(cls, snapshot: ContinuableSnapshot, *, message_count: int | None = None) -> SnapshotSummary:
        """The summary of a stored snapshot (one read back from a store, so it has a `seq`)."""
        if snapshot.seq is None:
            raise ValueError(
                f'snapshot of run {snapshot.run_id!r} has no seq: summarize snapshots read back from a store'
            )
        return cls(
            run_id=snapshot.run_id,
            seq=snapshot.seq,
            state=SnapshotState(snapshot.state),
            step_index=snapshot.step_index,
            message_count=len(snapshot.messages) if message_count is None else message_count,
            created_at=snapshot.timestamp,
            agent_name=snapshot.agent_name,
            conversation_id=snapshot.conversation_id,
            parent_run_id=snapshot.parent_run_id,
            metadata=dict(snapshot.metadata),
            idempotency_key=snapshot.idempotency_key,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SnapshotMessages:
    """Part of one stored snapshot's history: what `StepStore.get_snapshot_messages` answers.

    `messages` are the snapshot's messages from position `start` (counting from 0, oldest first)
    up to `stop`, which is at most `summary.message_count`.
    """

    summary: SnapshotSummary
    start: int
    messages: list[ModelMessage]

    @property
    def stop(self) -> int:
        return self.start + len(self.messages)
