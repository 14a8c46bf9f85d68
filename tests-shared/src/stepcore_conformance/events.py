"""The step-event trail: append order, seq, idempotency keys."""

from __future__ import annotations

import dataclasses

import pytest

from stepcore import EventKind, StepEvent, StepStore

from ._support import StoreFixtures, at, event, new_id, register

__all__ = ('EventsConformance',)


def _without_seq(events: list[StepEvent]) -> list[StepEvent]:
    return [dataclasses.replace(e, seq=None) for e in events]


class EventsConformance(StoreFixtures):
    """`append_event` and `list_events`."""

    async def test_events_round_trip_in_append_order(self, store: StepStore) -> None:
        run_id = await register(store)
        written = [
            StepEvent(
                run_id=run_id,
                kind=kind,
                step_index=i,
                timestamp=at(100 - i + 0.000123),  # timestamps go backwards: order is append order
                agent_name='agent',
                conversation_id='conv',
                parent_run_id='parent',
                tool_name='lookup' if 'tool' in kind.value else None,
                tool_call_id=f'call-{i}' if 'tool' in kind.value else None,
                error="RuntimeError('boom')" if kind.value.endswith('failed') else None,
                metadata={'i': str(i)},
                idempotency_key=f'key-{i}',
            )
            for i, kind in enumerate(EventKind)
        ]
        for e in written:
            await store.append_event(e)
        listed = await store.list_events(run_id=run_id)
        assert _without_seq(listed) == written

    async def test_event_read_back_equals_the_event_written(self, store: StepStore) -> None:
        # The store assigns `seq`; `==` leaves it out, so a read-back record equals what was written.
        run_id = await register(store)
        written = [event(run_id, n, metadata={'n': str(n)}) for n in range(3)]
        for e in written:
            await store.append_event(e)
        listed = await store.list_events(run_id=run_id)
        assert [e.seq for e in written] == [None, None, None]
        assert all(isinstance(e.seq, int) for e in listed), [e.seq for e in listed]
        assert listed == written
        assert listed[0] != written[1], '== must still compare the other fields'

    async def test_seq_is_assigned_and_strictly_increasing(self, store: StepStore) -> None:
        run_id = await register(store)
        for n in range(12):
            await store.append_event(event(run_id, n))
        seqs = [e.seq for e in await store.list_events(run_id=run_id)]
        assert all(isinstance(s, int) for s in seqs), seqs
        ints = [s for s in seqs if s is not None]
        assert ints == sorted(ints)
        assert len(set(ints)) == 12
        assert [e.step_index for e in await store.list_events(run_id=run_id)] == list(range(12))

    async def test_event_seq_given_by_the_caller_is_replaced(self, store: StepStore) -> None:
        run_id = await register(store)
        for n in range(3):
            await store.append_event(event(run_id, n, seq=7))
        seqs = [e.seq for e in await store.list_events(run_id=run_id)]
        assert len(set(seqs)) == 3, f'the store kept the seq the caller set: {seqs}'

    async def test_list_events_of_unknown_run_is_empty(self, store: StepStore) -> None:
        assert await store.list_events(run_id=new_id('missing')) == []

    async def test_applied_event_key_is_suppressed(self, store: StepStore) -> None:
        run_id = await register(store)
        first = event(run_id, 1, idempotency_key='k', metadata={'v': 'first'})
        await store.append_event(first)
        await store.append_event(event(run_id, 2, idempotency_key='k', metadata={'v': 'second'}))
        await store.append_event(event(run_id, 3, idempotency_key='other'))
        await store.append_event(event(run_id, 4, idempotency_key='k', kind=EventKind.RUN_FAILED))
        listed = await store.list_events(run_id=run_id)
        assert [e.idempotency_key for e in listed] == ['k', 'other']
        assert dataclasses.replace(listed[0], seq=None) == first

    async def test_none_idempotency_key_always_appends(self, store: StepStore) -> None:
        run_id = await register(store)
        same = event(run_id, 1)
        for _ in range(3):
            await store.append_event(same)
        listed = await store.list_events(run_id=run_id)
        assert _without_seq(listed) == [same, same, same]
        assert len({e.seq for e in listed}) == 3

    async def test_idempotency_keys_are_scoped_to_their_run(self, store: StepStore) -> None:
        run_a, run_b = await register(store), await register(store)
        await store.append_event(event(run_a, 1, idempotency_key='shared'))
        await store.append_event(event(run_b, 1, idempotency_key='shared'))
        assert len(await store.list_events(run_id=run_a)) == 1
        assert len(await store.list_events(run_id=run_b)) == 1

    async def test_runs_have_separate_trails(self, store: StepStore) -> None:
        run_a, run_b = await register(store), await register(store)
        for n in range(3):
            await store.append_event(event(run_a, n, metadata={'run': 'a'}))
            await store.append_event(event(run_b, n, metadata={'run': 'b'}))
        assert {e.metadata['run'] for e in await store.list_events(run_id=run_a)} == {'a'}
        assert [e.run_id for e in await store.list_events(run_id=run_b)] == [run_b] * 3

    async def test_stored_events_are_isolated_from_caller_objects(self, store: StepStore) -> None:
        run_id = await register(store)
        written = event(run_id, 1, metadata={'a': '1'})
        await store.append_event(written)
        written.metadata['a'] = 'changed after append'
        listed = await store.list_events(run_id=run_id)
        listed[0].metadata['a'] = 'changed after list'
        assert (await store.list_events(run_id=run_id))[0].metadata == {'a': '1'}

    async def test_list_events_page_reads_a_window_of_the_trail(self, store: StepStore) -> None:
        run_id = await register(store)
        for n in range(25):
            await store.append_event(event(run_id, n, metadata={'n': str(n)}))
        every = await store.list_events(run_id=run_id)
        seqs = [e.seq for e in every]
        assert await store.list_events_page(run_id) == every
        assert [e.seq for e in await store.list_events_page(run_id, limit=10)] == seqs[:10]
        # paging forward by the last seq read gives back the whole trail, once, in order
        paged: list[StepEvent] = []
        after: int | None = None
        while page := await store.list_events_page(run_id, after_seq=after, limit=10):
            assert len(page) <= 10
            paged.extend(page)
            after = page[-1].seq
        assert paged == every
        assert [e.seq for e in paged] == seqs
        assert [e.seq for e in await store.list_events_page(run_id, after_seq=seqs[19])] == seqs[20:]
        newest = await store.list_events_page(run_id, newest=True, limit=3)
        assert [e.seq for e in newest] == seqs[-3:], 'newest=True answers the last events, oldest first'
        assert newest == every[-3:]
        assert [e.seq for e in await store.list_events_page(run_id, after_seq=seqs[-1])] == []
        assert await store.list_events_page(new_id('never-written'), newest=True, limit=1) == []

    async def test_list_events_page_refuses_a_bad_window(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.append_event(event(run_id, 0))
        for bad in ({'limit': 0}, {'limit': -1}, {'after_seq': -1}, {'limit': 'ten'}, {'after_seq': True}):
            with pytest.raises(ValueError, match=str(next(iter(bad)))):
                await store.list_events_page(run_id, **bad)  # pyright: ignore[reportArgumentType]
        assert len(await store.list_events(run_id=run_id)) == 1
