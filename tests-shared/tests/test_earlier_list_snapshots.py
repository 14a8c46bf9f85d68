"""A store written against the earlier `list_snapshots(run_id)` signature still passes the snapshot section.

Such a store answers every snapshot of the run. `StepStore` notices the missing `include_interrupted`
keyword when the class is defined, warns, and filters the answer itself, so callers get the
current behaviour: complete snapshots by default, every one with `include_interrupted=True`.
"""

from __future__ import annotations

from typing import Any

import pytest

from stepcore import ContinuableSnapshot, InMemoryStepStore, RunRecord, StepEvent, StepStore, ToolEffectRecord
from stepcore_conformance import SnapshotsConformance

with pytest.warns(DeprecationWarning, match=r'EarlierSignature\.list_snapshots takes no include_interrupted'):

    class EarlierSignature(StepStore):
        """Delegates to an in-memory store; its `list_snapshots` has the earlier signature."""

        def __init__(self) -> None:
            self.inner = InMemoryStepStore()

        async def register_run(self, record: RunRecord) -> None:
            await self.inner.register_run(record)

        async def get_run(self, run_id: str) -> RunRecord | None:
            return await self.inner.get_run(run_id)

        async def list_runs(
            self, *, conversation_id: str | None = None, parent_run_id: str | None = None
        ) -> list[RunRecord]:
            return await self.inner.list_runs(conversation_id=conversation_id, parent_run_id=parent_run_id)

        async def delete_run(self, run_id: str) -> bool:
            return await self.inner.delete_run(run_id)

        async def append_event(self, event: StepEvent) -> None:
            await self.inner.append_event(event)

        async def list_events(self, run_id: str) -> list[StepEvent]:
            return await self.inner.list_events(run_id)

        async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
            await self.inner.save_snapshot(snapshot)

        async def list_snapshots(self, run_id: str) -> list[ContinuableSnapshot]:  # pyright: ignore[reportIncompatibleMethodOverride]
            """Every snapshot of the run, interrupted ones included."""
            return await self.inner.list_snapshots(run_id, include_interrupted=True)

        async def record_tool_effect(self, record: ToolEffectRecord) -> None:
            await self.inner.record_tool_effect(record)

        async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
            return await self.inner.list_tool_effects(run_id)


class TestEarlierSignature(SnapshotsConformance):
    @pytest.fixture
    async def store(self, store_options: dict[str, Any]) -> StepStore:
        assert not store_options
        return EarlierSignature()


def test_the_warning_says_what_to_declare() -> None:
    with pytest.warns(DeprecationWarning, match='include_interrupted') as caught:

        class Old(InMemoryStepStore):
            async def list_snapshots(self, run_id: str) -> list[ContinuableSnapshot]:  # pyright: ignore[reportIncompatibleMethodOverride]
                return await super().list_snapshots(run_id, include_interrupted=True)

    [warning] = caught
    assert 'async def list_snapshots(self, run_id, *, include_interrupted=False)' in str(warning.message)
    assert warning.filename == __file__, 'the warning must point at the class definition'
    assert Old.list_snapshots.__qualname__ == 'Old.list_snapshots'
    assert Old.list_snapshots.__code__.co_filename != __file__, 'the earlier signature must be wrapped'


def test_a_signature_with_the_keyword_is_left_alone() -> None:
    # No warning (warnings fail the test run), and the class keeps its own method.
    class Current(InMemoryStepStore):
        async def list_snapshots(self, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
            return await super().list_snapshots(run_id, include_interrupted=include_interrupted)

    class Forwarding(InMemoryStepStore):
        async def list_snapshots(self, run_id: str, **options: Any) -> list[ContinuableSnapshot]:  # pyright: ignore[reportIncompatibleMethodOverride]
            return await super().list_snapshots(run_id, **options)

    for cls in (Current, Forwarding):
        assert cls.list_snapshots.__code__.co_filename == __file__, f'{cls.__name__}.list_snapshots was replaced'
