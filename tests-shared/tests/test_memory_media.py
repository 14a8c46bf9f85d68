"""The kit's own media store passes the media section."""

import pytest

from stepcore import MediaStore
from stepcore_conformance import InMemoryMediaStore, MediaDamage, MediaStoreConformance


class TestInMemoryMediaStore(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self):
        return InMemoryMediaStore()

    @pytest.fixture
    def media_damage(self) -> MediaDamage:
        async def damage(store: MediaStore, uri: str, replacement: bytes) -> None:
            assert isinstance(store, InMemoryMediaStore)
            store.damage(uri, replacement)

        return damage
