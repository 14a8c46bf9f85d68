"""The store's id (`store_identity`, `store_location`): kept with the data, one per store.

Every store built on the engine keeps an id with its data: the same for every store object and process
on that data, also when several ask a fresh store at once, and another for another store. With its
location, it tells whether two stores are one (`stepcore.store.same_store.same_store`), which the command
line checks before it resumes a run with an agent whose store is not the one it was given.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, cast

import pytest

import stepcore
from stepcore import StepStore
from stepcore.backend import ENGINE_PORT, PERSISTENT, same_store

from ._support import StoreFixtures, needs_feature, other_store, register, require_feature_declared
from .persistence import second_store

__all__ = ('StoreIdentityConformance',)

_ID = re.compile(r'[0-9a-f]{32}')
"""A store id: a uuid4 in hex."""


class StoreIdentityConformance(StoreFixtures):
    """One id per store, kept with its data; a location naming where that data lives."""

    @needs_feature(ENGINE_PORT)
    async def test_a_store_keeps_one_id(self, store: StepStore) -> None:
        known = await store.store_identity()
        assert known is not None, f'{type(store).__name__} keeps no store id'
        assert _ID.fullmatch(known), f'{type(store).__name__} answered store id {known!r}: use a uuid4 in hex'
        await register(store)
        assert await store.store_identity() == known, 'the store id changed when a run was written'
        where = await store.store_location()
        assert where, f'{type(store).__name__} answered store location {where!r}'
        assert (await same_store(store, store))[0] is True

    @needs_feature(ENGINE_PORT)
    async def test_first_asks_at_once_agree(self, store: StepStore, store_spec: dict[str, Any] | None) -> None:
        # The fixture's store is new and nobody asked it for its id yet: two more store objects on its
        # data (the store itself when it has no store_spec) ask with it, all at once.
        async with other_store(store, store_spec) as second, other_store(store, store_spec) as third:
            found = await asyncio.gather(store.store_identity(), second.store_identity(), third.store_identity())
            assert len(set(found)) == 1, f'three first asks of one store at once answered {found}'
            assert await second.store_location() == await store.store_location()

    @needs_feature(PERSISTENT, ENGINE_PORT)
    async def test_the_id_outlives_the_store_object(self, store: StepStore, store_spec: dict[str, Any] | None) -> None:
        async with second_store(store_spec) as first:
            known = await first.store_identity()
            where = await first.store_location()
        await register(store)
        assert await store.store_identity() == known
        async with second_store(store_spec) as reopened:
            assert await reopened.store_identity() == known, 'a store opened again on the same data has another id'
            assert await reopened.store_location() == where
            same, why = await same_store(store, reopened)
            assert same is True, why

    async def test_another_store_has_another_id(
        self, store: StepStore, other_store_spec: dict[str, Any] | None
    ) -> None:
        require_feature_declared(store, ENGINE_PORT)
        if other_store_spec is None:
            pytest.skip(
                f'{type(self).__name__} has no other_store_spec fixture: override it (the stepcore.from_spec '
                'arguments of a store over other data) to check that another store has another id'
            )
        other = cast(StepStore, stepcore.from_spec(**other_store_spec))
        try:
            mine, theirs = await store.store_identity(), await other.store_identity()
            assert mine != theirs, f'two stores over different data have one id {mine!r}'
            same, why = await same_store(store, other)
            assert same is False, why
        finally:
            await other.aclose()
