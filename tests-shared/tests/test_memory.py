"""The in-memory store passes the whole kit."""

import pytest

from stepcore import InMemoryStepStore
from stepcore_conformance import StepStoreConformance


class TestInMemoryStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(self, store_options):
        return InMemoryStepStore(**store_options)
