"""The kit's own media store passes the media section."""

import pytest

from stepcore_conformance import InMemoryMediaStore, MediaStoreConformance


class TestInMemoryMediaStore(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self):
        return InMemoryMediaStore()
