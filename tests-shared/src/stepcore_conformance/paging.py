"""`list_runs` filters and paging, `list_runs_page` cursors, and refusal of bad values."""

from __future__ import annotations

from typing import Any

import pytest

from stepcore import EventKind, StepStore

from ._support import StoreFixtures, at, event, new_id, register

__all__ = ('PagingConformance',)


async def _ids(store: StepStore, **arguments: Any) -> list[str]:
    return [r.run_id for r in await store.list_runs(**arguments)]


async def _pages(store: StepStore, size: int, **arguments: Any) -> list[list[str]]:
    """Every page of `list_runs_page`, following `next_cursor` to the end."""
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page = await store.list_runs_page(limit=size, cursor=cursor, **arguments)
        pages.append([r.run_id for r in page.runs])
        if page.next_cursor is None:
            return pages
        assert len(pages) < 100, 'list_runs_page keeps answering a next_cursor'
        cursor = page.next_cursor


class PagingConformance(StoreFixtures):
    """Server-side filters, keyset paging and the order they keep; every store gets them from the engine."""

    async def _seven(self, store: StepStore) -> tuple[str, list[str]]:
        """Seven runs of a fresh conversation, registered out of order; three share one instant.
        Answers the conversation id and the run ids in listing order."""
        conversation_id = new_id('conv')
        names = {'e': at(50), 'a': at(10), 'c2': at(30), 'b': at(20), 'c1': at(30), 'f': at(60), 'c3': at(30)}
        ids = {name: f'{conversation_id}-{name}' for name in names}
        for name, started in names.items():
            await register(store, ids[name], conversation_id=conversation_id, started_at=started)
        return conversation_id, [ids[n] for n in ('a', 'b', 'c1', 'c2', 'c3', 'e', 'f')]

    async def test_runs_of_one_instant_are_ordered_by_run_id(self, store: StepStore) -> None:
        conversation_id, expected = await self._seven(store)
        assert await _ids(store, conversation_id=conversation_id) == expected
        assert await _ids(store, conversation_id=conversation_id, newest_first=True) == expected[::-1]

    async def test_limit_answers_the_first_runs_in_order(self, store: StepStore) -> None:
        conversation_id, expected = await self._seven(store)
        assert await _ids(store, conversation_id=conversation_id, limit=3) == expected[:3]
        assert await _ids(store, conversation_id=conversation_id, limit=3, newest_first=True) == expected[::-1][:3]
        assert await _ids(store, conversation_id=conversation_id, limit=0) == []
        assert await _ids(store, conversation_id=conversation_id, limit=100) == expected

    @pytest.mark.parametrize('size', [1, 2, 3, 7, 8])
    async def test_pages_cover_every_run_once_in_order(self, store: StepStore, size: int) -> None:
        conversation_id, expected = await self._seven(store)
        pages = await _pages(store, size, conversation_id=conversation_id)
        assert [run for page in pages for run in page] == expected
        assert all(len(page) == size for page in pages[:-1])
        assert 1 <= len(pages[-1]) <= size
        backwards = await _pages(store, size, conversation_id=conversation_id, newest_first=True)
        assert [run for page in backwards for run in page] == expected[::-1]

    async def test_a_page_does_not_shift_when_runs_come_and_go(self, store: StepStore) -> None:
        conversation_id, expected = await self._seven(store)
        first = await store.list_runs_page(conversation_id=conversation_id, limit=3)
        assert [r.run_id for r in first.runs] == expected[:3]
        assert first.next_cursor is not None
        # a run before the cursor is added and one already shown is deleted: the next page is unmoved
        await register(store, f'{conversation_id}-0', conversation_id=conversation_id, started_at=at(0))
        assert await store.delete_run(expected[0]) is True
        second = await store.list_runs_page(conversation_id=conversation_id, limit=3, cursor=first.next_cursor)
        assert [r.run_id for r in second.runs] == expected[3:6]

    async def test_started_after_and_before_are_exclusive_bounds(self, store: StepStore) -> None:
        conversation_id, expected = await self._seven(store)
        within = await _ids(store, conversation_id=conversation_id, started_after=at(10), started_before=at(50))
        assert within == expected[1:5]
        assert await _ids(store, conversation_id=conversation_id, started_after=at(30)) == expected[5:]
        assert await _ids(store, conversation_id=conversation_id, started_before=at(30), newest_first=True) == [
            expected[1],
            expected[0],
        ]
        naive = at(30).replace(tzinfo=None)  # a naive bound is taken as UTC
        assert await _ids(store, conversation_id=conversation_id, started_before=naive) == expected[:2]

    async def test_agent_filter_with_a_limit_still_fills_the_page(self, store: StepStore) -> None:
        conversation_id = new_id('conv')
        wanted: list[str] = []
        for n in range(12):
            agent = 'writer' if n % 4 == 3 else 'reader'
            run_id = await register(store, conversation_id=conversation_id, agent_name=agent, started_at=at(n))
            if agent == 'writer':
                wanted.append(run_id)
        assert await _ids(store, conversation_id=conversation_id, agent_name='writer', limit=2) == wanted[:2]
        pages = await _pages(store, 2, conversation_id=conversation_id, agent_name='writer')
        assert pages == [wanted[:2], wanted[2:]]
        assert await _ids(store, agent_name=new_id('nobody')) == []

    async def test_status_is_read_from_the_run_events(self, store: StepStore) -> None:
        conversation_id = new_id('conv')
        done = await register(store, conversation_id=conversation_id, started_at=at(1))
        failed = await register(store, conversation_id=conversation_id, started_at=at(2))
        running = await register(store, conversation_id=conversation_id, started_at=at(3))
        retried = await register(store, conversation_id=conversation_id, started_at=at(4))
        await store.append_event(event(done, 0, kind=EventKind.RUN_STARTED))
        await store.append_event(event(done, 1, kind=EventKind.RUN_COMPLETED))
        await store.append_event(event(failed, 0, kind=EventKind.RUN_FAILED, error='boom'))
        await store.append_event(event(running, 0, kind=EventKind.RUN_STARTED))
        # the newest terminal event decides: failed once, then completed
        await store.append_event(event(retried, 0, kind=EventKind.RUN_FAILED))
        await store.append_event(event(retried, 1, kind=EventKind.RUN_COMPLETED))
        assert await _ids(store, conversation_id=conversation_id, status='completed') == [done, retried]
        assert await _ids(store, conversation_id=conversation_id, status='failed') == [failed]
        assert await _ids(store, conversation_id=conversation_id, status='unfinished') == [running]
        page = await store.list_runs_page(conversation_id=conversation_id, status='completed', limit=1)
        assert [r.run_id for r in page.runs] == [done]
        assert page.next_cursor is not None
        rest = await store.list_runs_page(
            conversation_id=conversation_id, status='completed', limit=1, cursor=page.next_cursor
        )
        assert [r.run_id for r in rest.runs] == [retried]

    async def test_filters_combine_with_and(self, store: StepStore) -> None:
        conversation_id, parent = new_id('conv'), new_id('parent')
        match = await register(
            store, conversation_id=conversation_id, parent_run_id=parent, agent_name='a', started_at=at(5)
        )
        await register(store, conversation_id=conversation_id, parent_run_id=parent, agent_name='b', started_at=at(5))
        await register(store, conversation_id=conversation_id, agent_name='a', started_at=at(5))
        await register(store, conversation_id=conversation_id, parent_run_id=parent, agent_name='a', started_at=at(9))
        found = await _ids(
            store,
            conversation_id=conversation_id,
            parent_run_id=parent,
            agent_name='a',
            started_before=at(6),
            status='unfinished',
        )
        assert found == [match]

    @pytest.mark.parametrize(
        ('arguments', 'named'),
        [
            ({'limit': -1}, 'limit -1'),
            ({'limit': 'ten'}, "limit 'ten'"),
            ({'cursor': 'not-a-cursor'}, "cursor 'not-a-cursor'"),
            ({'status': 'done'}, "status 'done'"),
            ({'started_after': '2026-01-01'}, "started_after '2026-01-01'"),
            ({'agent_name': ''}, "agent_name ''"),
        ],
    )
    async def test_bad_values_are_refused_naming_them(
        self, store: StepStore, arguments: dict[str, Any], named: str
    ) -> None:
        conversation_id, expected = await self._seven(store)
        with pytest.raises(ValueError, match=named):
            await store.list_runs(conversation_id=conversation_id, **arguments)
        assert await _ids(store, conversation_id=conversation_id) == expected

    async def test_a_cursor_is_refused_by_a_listing_in_the_other_order(self, store: StepStore) -> None:
        conversation_id, _ = await self._seven(store)
        page = await store.list_runs_page(conversation_id=conversation_id, limit=2)
        assert page.next_cursor is not None
        with pytest.raises(ValueError, match='cursor'):
            await store.list_runs_page(
                conversation_id=conversation_id, limit=2, cursor=page.next_cursor, newest_first=True
            )
        with pytest.raises(ValueError, match='limit 0'):
            await store.list_runs_page(conversation_id=conversation_id, limit=0)

    async def test_the_earlier_call_shapes_still_answer_lists(self, store: StepStore) -> None:
        conversation_id, expected = await self._seven(store)
        everything = await store.list_runs()
        assert isinstance(everything, list)
        listed = [r.run_id for r in everything]
        assert [run for run in listed if run in expected] == expected
        assert await _ids(store, conversation_id=conversation_id, parent_run_id=None) == expected
        starts = [r.started_at for r in everything]
        assert starts == sorted(starts)
