"""DiskMediaStore against the shared conformance suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from media_disk import DiskMediaStore
from stepcore_conformance import MediaStoreConformance


class TestDiskMediaStore(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self, tmp_path: Path) -> DiskMediaStore:
        return DiskMediaStore(tmp_path / 'media')
