"""What is particular to `InMemoryStepStore` (the shared behaviour is checked by stepcore-conformance)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

import stepcore
from stepcore import ContinuableSnapshot, InMemoryStepStore, RunRecord, StepStore
from stepcore.common.features import (
    CHECKSUMS,
    ENCRYPTION,
    ENGINE_PORT,
    LEASES,
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
)
from stepcore_conformance import InMemoryMediaStore

T = datetime(2026, 1, 1, tzinfo=UTC)


def step(n: int) -> list[ModelMessage]:
    return [
        ModelResponse(parts=[TextPart(content=f'answer {n}')], timestamp=T),
        ModelRequest(parts=[UserPromptPart(content=f'question {n}', timestamp=T)]),
    ]


def test_declares_retention_only() -> None:
    assert InMemoryStepStore.features == frozenset({SNAPSHOT_RETENTION, ENCRYPTION, CHECKSUMS, ENGINE_PORT, LEASES})
    assert MEDIA_EXTERNALIZATION not in InMemoryStepStore.features
    assert PERSISTENT not in InMemoryStepStore.features
    assert isinstance(InMemoryStepStore(), StepStore)


@pytest.mark.parametrize(
    'options', [{'media_threshold_bytes': 1024}, {'media_store': InMemoryMediaStore()}], ids=['threshold', 'store']
)
def test_media_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(NotImplementedError, match="'media_externalization' is not declared"):
        InMemoryStepStore(**options)  # type: ignore[arg-type]


def test_invalid_bound_is_refused() -> None:
    with pytest.raises(ValueError, match='max_snapshots_per_run must be >= 1 or None, got 0'):
        InMemoryStepStore(max_snapshots_per_run=0)


def test_from_spec_memory() -> None:
    store = stepcore.from_spec(backend='memory', max_snapshots_per_run=3)
    assert isinstance(store, InMemoryStepStore)
    assert store.max_snapshots_per_run == 3


async def test_storage_grows_linearly_with_the_history() -> None:
    # Each message is stored once, however many snapshots contain it.
    store = InMemoryStepStore()
    await store.register_run(RunRecord(run_id='r', started_at=T))
    live: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content='start', timestamp=T)])]
    for n in range(50):
        live.extend(step(n))
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=live, step_index=n))
    data = store.port._data['r']  # pyright: ignore[reportAttributeAccessIssue]
    assert len(data.nodes) == len(live) == 101
    assert len(data.snapshots) == 50
    assert all(b'"messages"' not in s.body for s in data.snapshots)
    snapshots = await store.list_snapshots('r', include_interrupted=True)
    assert [len(s.messages) for s in snapshots] == [1 + 2 * (n + 1) for n in range(50)]


async def test_pruning_keeps_nodes_of_pruned_snapshots() -> None:
    store = InMemoryStepStore(max_snapshots_per_run=1)
    live: list[ModelMessage] = []
    for n in range(5):
        live.extend(step(n))
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=live, step_index=n))
    data = store.port._data['r']  # pyright: ignore[reportAttributeAccessIssue]
    assert [s.seq for s in data.snapshots] == [5]
    assert len(data.nodes) == 10
    latest = await store.latest_snapshot('r')
    assert latest is not None
    assert latest.messages == live


async def test_aclose_is_harmless() -> None:
    store = InMemoryStepStore()
    await store.aclose()
    await store.aclose()
