"""DiskMediaStore against the shared conformance suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from media_disk import DiskMediaStore
from stepcore.media import MediaStore
from stepcore_conformance import MediaDamage, MediaStoreConformance


class TestDiskMediaStore(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self, tmp_path: Path) -> DiskMediaStore:
        return DiskMediaStore(tmp_path / 'media')

    @pytest.fixture
    def media_damage(self) -> MediaDamage:
        async def damage(store: MediaStore, uri: str, replacement: bytes) -> None:
            assert isinstance(store, DiskMediaStore)
            store.path_for(uri).write_bytes(replacement)

        return damage
