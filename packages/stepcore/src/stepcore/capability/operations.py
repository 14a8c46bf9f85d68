"""The capability's durable operations: every store write, and every clock or uuid read that is stored."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from pydantic_ai.capabilities import durable_operation
from pydantic_ai.capabilities.abstract import AbstractCapability
from pydantic_ai.tools import AgentDepsT, RunContext

from stepcore.store.contract import as_step_store
from stepcore.store.models import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus, utcnow
from stepcore.store.protocols import StepStoreProtocol, StepWrite
from stepcore.store.step_store import StepStore

__all__ = ('CAPABILITY_ID', 'OPERATION_NAMES', 'RegistrationIdentity', 'StepOperations')

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


class RegistrationIdentity(BaseModel):
    """The journaled identity of a run registration: a retried registration carries the same one."""

    registration_id: str
    started_at: datetime


class StepOperations(AbstractCapability[AgentDepsT]):
    """The six durable operations of `StepPersistence` (`OPERATION_NAMES`), and the `journal_*` calls built on them.

    Under a durable engine each operation is journaled (scoped by the capability id), so a replayed
    workflow reuses the stored clock and uuid values instead of writing again; without one they
    run inline. Each operation stamps its record with the time it runs.
    """

    store: StepStoreProtocol

    @property
    def bound_store(self) -> StepStore:
        """`store` as stepcore reaches it (`stepcore.store.contract.as_step_store`), made once per store."""
        bound: tuple[object, StepStore] | None = self.__dict__.get('_bound_store')
        if bound is None or bound[0] is not self.store:
            bound = (self.store, as_step_store(self.store))
            self.__dict__['_bound_store'] = bound
        return bound[1]

    @durable_operation(name='registration_identity')
    async def _op_registration_identity(self, ctx: RunContext[Any]) -> RegistrationIdentity:
        return RegistrationIdentity(registration_id=uuid.uuid4().hex, started_at=utcnow())

    @durable_operation(name='register_run')
    async def _op_register_run(self, ctx: RunContext[Any], record: RunRecord) -> None:
        await self.bound_store.register_run(record)

    @durable_operation(name='append_event')
    async def _op_append_event(self, ctx: RunContext[Any], event: StepEvent) -> datetime:
        timestamp = utcnow()
        await self.bound_store.append_event(event.model_copy(update={'timestamp': timestamp}))
        return timestamp

    @durable_operation(name='save_snapshot')
    async def _op_save_snapshot(self, ctx: RunContext[Any], snapshot: ContinuableSnapshot) -> datetime:
        timestamp = utcnow()
        await self.bound_store.save_snapshot(snapshot.model_copy(update={'timestamp': timestamp}))
        return timestamp

    @durable_operation(name='tool_effect_started')
    async def _op_tool_effect_started(
        self, ctx: RunContext[Any], record: ToolEffectRecord, new_call: bool
    ) -> ToolEffectRecord:
        now = utcnow()
        stamped = record.model_copy(update={'started_at': now, 'updated_at': now} if new_call else {'updated_at': now})
        await self.bound_store.record_tool_effect(stamped)
        return stamped

    @durable_operation(name='tool_effect_finished')
    async def _op_tool_effect_finished(self, ctx: RunContext[Any], record: ToolEffectRecord) -> ToolEffectRecord:
        now = utcnow()
        stamped = record.model_copy(update={'updated_at': now, 'ended_at': now})
        await self.bound_store.record_tool_effect(stamped)
        return stamped

    async def journal_registration(self, ctx: RunContext[Any], record: RunRecord) -> RunRecord:
        """Register `record` under a journaled registration id and start time; returns it as stored."""
        identity = await self._op_registration_identity(ctx)
        registered = record.model_copy(
            update={'registration_id': identity.registration_id, 'started_at': identity.started_at}
        )
        await self._op_register_run(ctx, registered)
        return registered

    async def journal_snapshot(self, ctx: RunContext[Any], snapshot: ContinuableSnapshot) -> None:
        """Save `snapshot` as one durable operation."""
        await self._op_save_snapshot(ctx, snapshot)

    async def journal_write(self, ctx: RunContext[Any], write: StepWrite, *, new_call: bool = False) -> StepWrite:
        """Write one event or ledger entry as one durable operation; returns it as stored.

        `new_call` marks a `started` entry written before its tool runs: its start time is stamped too.
        """
        if isinstance(write, StepEvent):
            await self._op_append_event(ctx, write)
            return write
        if write.status is ToolEffectStatus.STARTED:
            return await self._op_tool_effect_started(ctx, write, new_call)
        return await self._op_tool_effect_finished(ctx, write)
