"""Applying a batch of event and ledger writes to any store, batched when the store supports it."""

from __future__ import annotations

from collections.abc import Sequence

from .models import ContinuableSnapshot, StepEvent, ToolEffectRecord
from .protocols import StepStore, StepWrite

__all__ = ('apply_writes', 'check_writes')


def check_writes(writes: Sequence[object]) -> Sequence[StepWrite]:
    """`writes` unchanged when every item is a `StepEvent` or `ToolEffectRecord`; `TypeError` otherwise.

    Stores call it at the top of `write_batch`, so a bad batch is refused before anything is written.
    """
    for index, write in enumerate(writes):
        if not isinstance(write, StepEvent | ToolEffectRecord):
            raise TypeError(
                f'write_batch got {type(write).__name__} at position {index}: '
                'pass StepEvent and ToolEffectRecord objects only (snapshots go through save_snapshot)'
            )
    return writes  # pyright: ignore[reportReturnType]  # checked item by item above


async def apply_writes(
    store: StepStore, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None
) -> None:
    """Apply `writes` in order, then save `snapshot`: one `write_batch` call when the store has it
    (and there is more than one thing to write), else one call per write."""
    write_batch = getattr(store, 'write_batch', None)
    if write_batch is not None and len(writes) + (snapshot is not None) > 1:
        await write_batch(writes, snapshot=snapshot)
        return
    for write in check_writes(writes):
        if isinstance(write, StepEvent):
            await store.append_event(write)
        else:
            await store.record_tool_effect(write)
    if snapshot is not None:
        await store.save_snapshot(snapshot)
