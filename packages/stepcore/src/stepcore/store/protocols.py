"""The store contract: the reference's ten methods (`StepStoreProtocol`), and what a batch writes.

`stepcore.store.step_store.StepStore` is the base class with every other method derived from
these; `stepcore.store.contract` reaches a store written to the protocol alone.
"""

from __future__ import annotations

from typing import Protocol, TypeAlias, runtime_checkable

from stepcore.store.models import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord

__all__ = ('CONTRACT_METHODS', 'StepStoreProtocol', 'StepWrite')

CONTRACT_METHODS: tuple[str, ...] = (
    'register_run',
    'get_run',
    'list_runs',
    'append_event',
    'list_events',
    'save_snapshot',
    'latest_snapshot',
    'record_tool_effect',
    'get_tool_effect',
    'list_unresolved_tool_effects',
)
"""The reference's protocol: what `StepPersistence` requires of a store."""


@runtime_checkable
class StepStoreProtocol(Protocol):
    """The reference's contract, as a protocol: what a store must have for `StepPersistence`.

    A class with these methods and no base class is a store (a `StepStore` subclass has them too).
    Type your own store's parameter with it to accept both.
    """

    async def register_run(self, record: RunRecord) -> None: ...

    async def get_run(self, *, run_id: str) -> RunRecord | None: ...

    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]: ...

    async def append_event(self, event: StepEvent) -> None: ...

    async def list_events(self, *, run_id: str) -> list[StepEvent]: ...

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None: ...

    async def latest_snapshot(
        self, *, run_id: str, include_interrupted: bool = False
    ) -> ContinuableSnapshot | None: ...

    async def record_tool_effect(self, record: ToolEffectRecord) -> None: ...

    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None: ...

    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]: ...


StepWrite: TypeAlias = StepEvent | ToolEffectRecord
"""One write `StepStore.write_batch` applies: an event to append or a ledger entry to upsert."""
