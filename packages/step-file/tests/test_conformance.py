"""FileStepStore against the shared conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from step_file import FileStepStore
from stepcore_conformance import (
    ConcurrencyConformance,
    EffectsConformance,
    EventsConformance,
    PersistenceConformance,
    SnapshotsConformance,
    StepStoreConformance,
)


class TestFileStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(self, tmp_path: Path, store_options: dict[str, Any]) -> AsyncIterator[FileStepStore]:
        store = FileStepStore(tmp_path / 'runs', **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, tmp_path: Path) -> dict[str, Any]:
        return {'backend': 'file', 'directory': str(tmp_path / 'runs')}


class TestFileStepStoreFullDurability(
    EventsConformance, SnapshotsConformance, EffectsConformance, ConcurrencyConformance, PersistenceConformance
):
    """The write-path sections again, with every append and rename fsynced."""

    @pytest.fixture
    async def store(self, tmp_path: Path, store_options: dict[str, Any]) -> AsyncIterator[FileStepStore]:
        store = FileStepStore(tmp_path / 'runs', durability='full', **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, tmp_path: Path) -> dict[str, Any]:
        return {'backend': 'file', 'directory': str(tmp_path / 'runs'), 'durability': 'full'}
