"""Applying a batch of event and ledger writes to any store."""

from __future__ import annotations

from collections.abc import Sequence

from .models import ContinuableSnapshot
from .protocols import StepStore, StepWrite, check_writes

__all__ = ('apply_writes', 'check_writes')


async def apply_writes(
    store: StepStore, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None
) -> None:
    """Save `snapshot` and apply `writes` with the store's `write_batch` (see `StepStore.write_batch`)."""
    await store.write_batch(writes, snapshot=snapshot)
