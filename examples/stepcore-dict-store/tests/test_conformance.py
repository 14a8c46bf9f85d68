import pytest
from stepcore_dict_store import DictStepStore

from stepcore_conformance import StepStoreConformance


class TestDictStore(StepStoreConformance):
    @pytest.fixture
    async def store(self, store_options):
        return DictStepStore(**store_options)
