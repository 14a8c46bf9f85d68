"""Reading a run's snapshots for the inspector a part at a time, and keeping the parts decoded."""

from __future__ import annotations

from collections import OrderedDict

from pydantic_ai.messages import ModelMessage

from stepcore.store.models import SnapshotSummary
from stepcore.store.step_store import StepStore

__all__ = ('PARTS_KEPT', 'SnapshotParts')

PARTS_KEPT = 32
"""Parts of snapshots the inspector keeps decoded (a page of messages, the messages a snapshot adds
to the one before it, a message holding media), so that paging back and forth and loading a page's
images decode each message once."""


class SnapshotParts:
    """Reads a run's snapshots a part at a time, and keeps the parts it decoded.

    A stored snapshot never changes, but a run can be deleted and written again under the same id:
    a kept part is used only while the store's summary still matches the one it was read under.
    """

    def __init__(self, store: StepStore, size: int = PARTS_KEPT) -> None:
        self._store = store
        self._size = size
        self._kept: OrderedDict[tuple[str, int, int, int], tuple[SnapshotSummary, list[ModelMessage]]] = OrderedDict()
        self._shared: OrderedDict[tuple[str, int, int], tuple[SnapshotSummary, SnapshotSummary, int]] = OrderedDict()

    async def find(self, run_id: str, seq: int) -> tuple[list[SnapshotSummary], int]:
        """The run's snapshot summaries and the position of `seq` among them; `LookupError` naming
        the seqs there are."""
        retained = await self._store.list_snapshot_summaries(run_id, include_interrupted=True)
        position = next((i for i, s in enumerate(retained) if s.seq == seq), None)
        if position is None:
            have = ', '.join(str(s.seq) for s in retained) or 'none'
            raise LookupError(f'run {run_id!r} has no snapshot with seq {seq}; its retained snapshots: {have}')
        return retained, position

    async def messages(self, summary: SnapshotSummary, start: int, stop: int) -> list[ModelMessage]:
        """Messages `start` to `stop` of the summarized snapshot."""
        start, stop = min(start, summary.message_count), min(stop, summary.message_count)
        if stop <= start:
            return []
        key = (summary.run_id, summary.seq, start, stop)
        found = self._kept.get(key)
        if found is not None and found[0] == summary:
            self._kept.move_to_end(key)
            return found[1]
        part = await self._store.get_snapshot_messages(summary.run_id, summary.seq, start=start, stop=stop)
        if part is None:
            raise LookupError(f'snapshot {summary.seq} of run {summary.run_id!r} is gone (deleted or pruned)')
        self._kept[key] = (summary, part.messages)
        while len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return part.messages

    async def shared(self, summary: SnapshotSummary, previous: SnapshotSummary) -> int:
        """How many leading messages the snapshot shares with the one before it, as stored."""
        key = (summary.run_id, summary.seq, previous.seq)
        found = self._shared.get(key)
        if found is not None and found[:2] == (summary, previous):
            return found[2]
        count = await self._store.shared_message_count(summary.run_id, summary.seq, previous.seq)
        self._shared[key] = (summary, previous, count)
        while len(self._shared) > self._size:
            self._shared.popitem(last=False)
        return count
