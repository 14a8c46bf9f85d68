"""Run records: registration, lookup, lineage filters and ordering."""

from __future__ import annotations

import dataclasses
from datetime import timedelta, timezone
from typing import Any

import pytest

from stepcore import RunRecord, StepStore

from ._support import StoreFixtures, at, new_id, register

__all__ = ('RunsConformance',)


class RunsConformance(StoreFixtures):
    """`register_run`, `get_run` and `list_runs`."""

    async def test_register_and_get_run_round_trips_every_field(self, store: StepStore) -> None:
        record = RunRecord(
            run_id=new_id('run'),
            agent_name='librarian',
            conversation_id=new_id('conv'),
            parent_run_id=new_id('parent'),
            started_at=at(1.234567),
            metadata={'tenant': 'acme', 'ünïcode key': 'välue', 'empty': ''},
            registration_id='reg-1',
        )
        await store.register_run(record)
        assert await store.get_run(run_id=record.run_id) == record

    async def test_optional_fields_round_trip_as_none(self, store: StepStore) -> None:
        record = RunRecord(run_id=new_id('run'), started_at=at(0))
        await store.register_run(record)
        assert await store.get_run(run_id=record.run_id) == record

    async def test_get_run_of_unknown_id_is_none(self, store: StepStore) -> None:
        assert await store.get_run(run_id=new_id('missing')) is None

    async def test_stored_run_is_isolated_from_caller_objects(self, store: StepStore) -> None:
        record = RunRecord(run_id=new_id('run'), metadata={'a': '1'}, started_at=at(0))
        await store.register_run(record)
        record.metadata['a'] = 'changed after register'
        fetched = await store.get_run(run_id=record.run_id)
        assert fetched is not None
        fetched.metadata['b'] = 'changed after get'
        again = await store.get_run(run_id=record.run_id)
        assert again is not None
        assert again.metadata == {'a': '1'}

    async def test_duplicate_run_id_raises_value_error(self, store: StepStore) -> None:
        run_id = await register(store, agent_name='first')
        with pytest.raises(ValueError, match=rf"{run_id}'? is already in the store"):
            await store.register_run(RunRecord(run_id=run_id, agent_name='second', started_at=at(5)))
        stored = await store.get_run(run_id=run_id)
        assert stored is not None
        assert stored.agent_name == 'first'

    async def test_duplicate_with_a_different_registration_id_raises(self, store: StepStore) -> None:
        run_id = await register(store, registration_id='reg-a')
        with pytest.raises(ValueError, match=rf"{run_id}'? is already in the store"):
            await store.register_run(RunRecord(run_id=run_id, registration_id='reg-b', started_at=at(0)))

    async def test_duplicate_without_registration_id_raises_even_if_stored_has_one(self, store: StepStore) -> None:
        run_id = await register(store, registration_id='reg-a')
        with pytest.raises(ValueError, match=run_id):
            await store.register_run(RunRecord(run_id=run_id, started_at=at(0)))

    async def test_retried_registration_with_the_same_registration_id_is_a_no_op(self, store: StepStore) -> None:
        original = RunRecord(
            run_id=new_id('run'), agent_name='a', metadata={'try': '1'}, registration_id='reg-1', started_at=at(1)
        )
        await store.register_run(original)
        retry = dataclasses.replace(original, metadata={'try': '2'}, started_at=at(9))
        await store.register_run(retry)
        await store.register_run(retry)
        assert await store.get_run(run_id=original.run_id) == original
        assert [r.run_id for r in await store.list_runs(conversation_id=None)].count(original.run_id) == 1

    async def test_list_runs_orders_by_started_at_ascending(self, store: StepStore) -> None:
        conversation_id = new_id('conv')
        plus_two = timezone(timedelta(hours=2))
        # Registered out of order; one timestamp carries a +02:00 offset, so ordering must be by
        # instant, not by the text of the timestamp.
        starts = {
            'c': at(30),
            'a': at(10),
            'd': at(40).astimezone(plus_two),
            'b': at(20),
            'e': at(50.000001),
        }
        ids = {name: new_id(name) for name in starts}
        for name, started_at in starts.items():
            await register(store, ids[name], conversation_id=conversation_id, started_at=started_at)
        listed = await store.list_runs(conversation_id=conversation_id)
        assert [r.run_id for r in listed] == [ids[n] for n in 'abcde']
        assert [r.started_at for r in listed] == sorted(starts.values())

    async def test_list_runs_filters_combine_with_and(self, store: StepStore) -> None:
        conv_a, conv_b = new_id('conv-a'), new_id('conv-b')
        parent_p, parent_q = new_id('parent-p'), new_id('parent-q')
        a_p = await register(store, conversation_id=conv_a, parent_run_id=parent_p, started_at=at(1))
        a_q = await register(store, conversation_id=conv_a, parent_run_id=parent_q, started_at=at(2))
        b_p = await register(store, conversation_id=conv_b, parent_run_id=parent_p, started_at=at(3))
        a_none = await register(store, conversation_id=conv_a, started_at=at(4))

        async def ids(**filters: Any) -> list[str]:
            return [r.run_id for r in await store.list_runs(**filters)]

        assert await ids(conversation_id=conv_a, parent_run_id=parent_p) == [a_p]
        assert await ids(conversation_id=conv_b, parent_run_id=parent_q) == []
        assert await ids(conversation_id=conv_a) == [a_p, a_q, a_none]
        assert await ids(parent_run_id=parent_p) == [a_p, b_p]
        assert await ids(conversation_id=new_id('conv-none')) == []

    async def test_list_runs_without_filters_lists_every_run_in_order(self, store: StepStore) -> None:
        late = await register(store, started_at=at(200))
        early = await register(store, started_at=at(100))
        listed = [r.run_id for r in await store.list_runs()]
        assert early in listed
        assert late in listed
        assert listed.index(early) < listed.index(late)
        starts = [r.started_at for r in await store.list_runs()]
        assert starts == sorted(starts)

    async def test_list_runs_returns_full_records(self, store: StepStore) -> None:
        conversation_id = new_id('conv')
        record = RunRecord(
            run_id=new_id('run'),
            agent_name='n',
            conversation_id=conversation_id,
            metadata={'k': 'v'},
            registration_id='r',
            started_at=at(3),
        )
        await store.register_run(record)
        assert await store.list_runs(conversation_id=conversation_id) == [record]
