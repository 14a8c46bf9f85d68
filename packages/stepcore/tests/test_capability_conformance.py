"""The kit's agent section, run against the in-memory store.

The capability's own scenarios (every way a run can go) are in `test_capability_scenarios.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from stepcore import InMemoryStepStore
from stepcore_conformance.capability import CapabilityConformance


class TestCapabilityInMemory(CapabilityConformance):
    @pytest.fixture
    async def store(self) -> AsyncIterator[InMemoryStepStore]:
        store = InMemoryStepStore()
        yield store
        await store.aclose()
