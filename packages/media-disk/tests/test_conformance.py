"""DiskMediaStore against the shared conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from media_disk import DiskMediaStore
from stepcore_conformance import MediaStoreConformance


class TestDiskMediaStore(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self, tmp_path: Path) -> AsyncIterator[DiskMediaStore]:
        yield DiskMediaStore(tmp_path / 'media')
