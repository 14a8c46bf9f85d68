"""The in-memory store passes the whole kit."""

from __future__ import annotations

from typing import Any, cast

import pytest

from stepcore import InMemoryStepStore, StepStore
from stepcore.backend import MemoryPort
from stepcore_conformance import Damage, StepStoreConformance


async def damage_memory(store: StepStore, kind: str, run_id: str, ident: int | str | None, replacement: bytes) -> None:
    """Overwrite one stored body among the memory port's rows (the kit's damage hook)."""
    port = cast(MemoryPort, cast(InMemoryStepStore, store).port)
    runs = port._runs  # pyright: ignore[reportPrivateUsage]
    data = port._data[run_id]  # pyright: ignore[reportPrivateUsage]
    if kind == 'run':
        runs[run_id].body = replacement
        return
    if kind == 'event':
        rows = [r for r in data.events if r.seq == ident]
    elif kind == 'effect':
        rows = [data.effects[str(ident)]]
    elif kind == 'snapshot':
        rows = [r for r in data.snapshots if r.seq == ident]
    else:
        assert kind == 'message', kind
        marked = [n for n, (_, body) in data.nodes.items() if str(ident).encode() in body]
        assert marked, f'no stored message of {run_id!r} holds {ident!r}'
        for node in marked:
            data.nodes[node] = (data.nodes[node][0], replacement)
        return
    assert len(rows) == 1, f'no {kind} {ident!r} stored for {run_id!r}'
    rows[0].body = replacement


class TestInMemoryStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(self, store_options: dict[str, Any]) -> InMemoryStepStore:
        return InMemoryStepStore(**store_options)

    @pytest.fixture
    def other_store_spec(self) -> dict[str, Any]:
        return {'backend': 'memory'}  # every memory store is a store of its own

    @pytest.fixture
    def damage(self) -> Damage:
        return damage_memory
