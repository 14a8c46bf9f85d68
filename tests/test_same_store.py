"""`same_store`: one store id in one place is one store; a copy, another store, or a store without an id is not.

The stores are real: SQLite files (one copied with `shutil.copy`), memory stores, and stores written
to the reference's contract alone, which keep no id.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from step_sqlite import SqliteStepStore
from stepcore import InMemoryStepStore, RunRecord
from stepcore.engine import Port, ops
from stepcore.engine.memory import MemoryPort
from stepcore.store.contract import as_step_store
from stepcore.store.same_store import same_store


async def test_one_database_by_two_paths_is_one_store(tmp_path: Path) -> None:
    (tmp_path / 'elsewhere').mkdir()
    (tmp_path / 'elsewhere' / 'link.db').symlink_to(tmp_path / 'runs.db')
    async with (
        SqliteStepStore(tmp_path / 'runs.db') as first,
        SqliteStepStore(tmp_path / 'elsewhere' / 'link.db') as second,
    ):
        same, why = await same_store(first, second)
        assert same is True, why
        assert why == f"both are database '{tmp_path / 'runs.db'}' (store id {await first.store_identity()})"
        assert await same_store(first, first) == (True, f"both are database '{tmp_path / 'runs.db'}', one store object")


async def test_a_copied_database_is_not_the_same_store(tmp_path: Path) -> None:
    async with SqliteStepStore(tmp_path / 'runs.db') as original:
        await original.register_run(RunRecord(run_id='r-1'))
        known = await original.store_identity()
    shutil.copy(tmp_path / 'runs.db', tmp_path / 'copy.db')
    async with SqliteStepStore(tmp_path / 'runs.db') as original, SqliteStepStore(tmp_path / 'copy.db') as copy:
        assert await copy.store_identity() == known  # the id travels with the data
        assert await copy.get_run('r-1') is not None
        same, why = await same_store(original, copy, names=('the agent store', 'the given store'))
        assert same is False
        assert why == (
            f"the agent store (database '{tmp_path / 'runs.db'}') and the given store (database "
            f"'{tmp_path / 'copy.db'}') are two copies of one store (both carry store id {known}), not one store"
        )


async def test_two_memory_stores_are_two_stores() -> None:
    first, second = InMemoryStepStore(), InMemoryStepStore()
    same, why = await same_store(first, second)
    assert same is False
    assert why.startswith('they are two different stores, both process memory (store ids '), why


class ContractOnly:
    """A store of one's own, written to the reference's ten methods over a memory store: no store id."""

    def __init__(self) -> None:
        self.inner = InMemoryStepStore()

    async def register_run(self, record: RunRecord) -> None:
        await self.inner.register_run(record)

    async def get_run(self, run_id: str) -> Any:
        return await self.inner.get_run(run_id)

    async def list_runs(self, *, conversation_id: str | None = None, parent_run_id: str | None = None) -> Any:
        return await self.inner.list_runs(conversation_id=conversation_id, parent_run_id=parent_run_id)

    async def append_event(self, event: Any) -> None:
        await self.inner.append_event(event)

    async def list_events(self, run_id: str) -> Any:
        return await self.inner.list_events(run_id)

    async def save_snapshot(self, snapshot: Any) -> None:
        await self.inner.save_snapshot(snapshot)

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> Any:
        return await self.inner.latest_snapshot(run_id, include_interrupted=include_interrupted)

    async def record_tool_effect(self, record: Any) -> None:
        await self.inner.record_tool_effect(record)

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> Any:
        return await self.inner.get_tool_effect(run_id, tool_call_id)

    async def list_unresolved_tool_effects(self, run_id: str) -> Any:
        return await self.inner.list_unresolved_tool_effects(run_id)


async def test_a_store_without_an_id_cannot_be_told(tmp_path: Path) -> None:
    mine = ContractOnly()
    assert await as_step_store(mine).store_identity() is None
    async with SqliteStepStore(tmp_path / 'runs.db') as database:
        same, why = await same_store(mine, database, names=('the agent store', 'the given store'))
        assert same is None
        assert why == (
            f'cannot tell whether the agent store (a ContractOnly) and the given store (database '
            f"'{tmp_path / 'runs.db'}') are one store: the agent store (a ContractOnly) keeps no store id"
        )
    assert (await same_store(mine, mine))[0] is True  # one object is one store


class EarlierPort(MemoryPort):
    """A port written before stores kept an id: its `store_identity` is the base class's."""

    store_identity = Port.store_identity  # pyright: ignore[reportAssignmentType]


class EarlierStore(InMemoryStepStore):
    def __init__(self) -> None:
        super().__init__()
        self.port = EarlierPort()


async def test_an_engine_store_whose_port_keeps_no_id_cannot_be_told() -> None:
    earlier = EarlierStore()
    with pytest.raises(NotImplementedError, match='EarlierPort does not implement store_identity'):
        await earlier.store_identity()
    assert isinstance(earlier.port, EarlierPort)
    assert ops.StoreIdentity.method == 'store_identity'
    same, why = await same_store(earlier, InMemoryStepStore())
    assert same is None
    assert 'keeps no store id' in why
