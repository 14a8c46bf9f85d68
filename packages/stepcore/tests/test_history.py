"""HistoryIndex: what a save writes (diff, walk), what it remembers (commit), and reading chains back."""

from __future__ import annotations

from collections.abc import Hashable
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolReturnPart, UserPromptPart

from stepcore.engine._history import REFRESH_WINDOW, TAIL_RECHECK, HistoryDelta, HistoryIndex, shares_prefix, walk_chain
from stepcore.media.walker import MediaWalker
from stepcore.store.codec import encode_message
from stepcore_conformance import InMemoryMediaStore

T = datetime(2026, 1, 1, tzinfo=UTC)


def req(text: str) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(content=text, timestamp=T)])


def res(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content=text)], timestamp=T)


def history(n: int, tag: str = 'm') -> list[ModelMessage]:
    return [req(f'{tag}{i}') if i % 2 == 0 else res(f'{tag}{i}') for i in range(n)]


class NodeTable:
    """What a store keeps: node id -> (parent, body), written the way `_history.py` prescribes."""

    def __init__(self) -> None:
        self.nodes: dict[Hashable, tuple[Hashable | None, bytes]] = {}

    def write(self, delta: HistoryDelta) -> list[Hashable]:
        ids: list[Hashable] = []
        parent = delta.parent
        for body in delta.new_messages:
            node = len(self.nodes)
            self.nodes[node] = (parent, body)
            ids.append(node)
            parent = node
        return ids

    def lookup(self, node: Hashable) -> tuple[Hashable | None, bytes]:
        return self.nodes[node]


async def diffed(index: HistoryIndex, run_id: str, messages: list[ModelMessage]) -> HistoryDelta:
    """What a save of `messages` writes, in stored form: `diff`, then `walk`, as the engine saves."""
    delta = index.diff(run_id, messages)
    await index.walk(delta)
    return delta


def head_of(delta: HistoryDelta, new_nodes: list[Hashable]) -> Hashable | None:
    """The head node of the history a written delta describes."""
    return new_nodes[-1] if new_nodes else delta.parent


async def save(
    index: HistoryIndex, table: NodeTable, run_id: str, messages: list[ModelMessage]
) -> tuple[HistoryDelta, Hashable | None]:
    delta = await diffed(index, run_id, messages)
    ids = table.write(delta)
    index.commit(delta, ids)
    return delta, head_of(delta, ids)


async def read(index: HistoryIndex, table: NodeTable, head: Hashable | None, length: int) -> list[ModelMessage]:
    return await index.decode(walk_chain(head, length, table.lookup))


@pytest.fixture
def index() -> HistoryIndex:
    return HistoryIndex(MediaWalker(None))


async def test_first_save_writes_everything(index: HistoryIndex) -> None:
    table = NodeTable()
    messages = history(4)
    delta, head = await save(index, table, 'r', messages)
    assert (delta.parent, delta.shared, delta.total) == (None, 0, 4)
    assert delta.new_messages == [encode_message(m) for m in messages]
    assert head == 3
    assert await read(index, table, head, 4) == messages


async def test_growth_writes_only_new_messages(index: HistoryIndex) -> None:
    table = NodeTable()
    live = history(4)
    await save(index, table, 'r', live)
    live.extend(history(3, tag='n'))
    delta, head = await save(index, table, 'r', live)
    assert (delta.parent, delta.shared, delta.total, len(delta.new_messages)) == (3, 4, 7, 3)
    assert len(table.nodes) == 7
    assert await read(index, table, head, 7) == live


async def test_unchanged_history_writes_nothing(index: HistoryIndex) -> None:
    table = NodeTable()
    live = history(5)
    _, first = await save(index, table, 'r', live)
    delta, head = await save(index, table, 'r', live)
    assert delta.new_messages == []
    assert head == first
    assert delta.total == 5


async def test_shortened_history_reuses_the_prefix_node(index: HistoryIndex) -> None:
    table = NodeTable()
    live = history(6)
    await save(index, table, 'r', live)
    delta, head = await save(index, table, 'r', live[:2])
    assert delta.new_messages == []
    assert (delta.parent, head, delta.total) == (1, 1, 2)
    assert await read(index, table, head, 2) == live[:2]
    # Growing again from the shortened history branches off node 1.
    grown = [*live[:2], res('branch')]
    delta, head = await save(index, table, 'r', grown)
    assert (delta.parent, len(delta.new_messages)) == (1, 1)
    assert await read(index, table, head, 3) == grown


async def test_history_emptied(index: HistoryIndex) -> None:
    table = NodeTable()
    await save(index, table, 'r', history(3))
    delta, head = await save(index, table, 'r', [])
    assert (delta.parent, head, delta.total, delta.new_messages) == (None, None, 0, [])
    assert await read(index, table, head, 0) == []


async def test_same_length_rewrite_of_an_old_message_with_a_new_object(index: HistoryIndex) -> None:
    table = NodeTable()
    live = history(10)
    _, old_head = await save(index, table, 'r', live)
    rewritten = list(live)
    rewritten[2] = req('rewritten')
    delta, head = await save(index, table, 'r', rewritten)
    assert (delta.parent, delta.shared, len(delta.new_messages), delta.total) == (1, 2, 8, 10)
    assert await read(index, table, head, 10) == rewritten
    assert await read(index, table, old_head, 10) == live  # the older snapshot is untouched


async def test_new_objects_with_equal_content_are_reused(index: HistoryIndex) -> None:
    table = NodeTable()
    await save(index, table, 'r', history(6))
    reloaded = [*history(6), res('next')]  # every object is new, the first six equal
    delta, _ = await save(index, table, 'r', reloaded)
    assert (delta.shared, len(delta.new_messages)) == (6, 1)


class Refuses:
    """A tool return value whose `==` raises, as an array's does."""

    def __eq__(self, other: object) -> bool:
        raise ValueError('the truth value is ambiguous')

    __hash__ = object.__hash__


def returned(value: object, text: str) -> ModelRequest:
    return ModelRequest(parts=[ToolReturnPart('t', value, tool_call_id=text, timestamp=T)])


async def test_a_value_whose_equality_raises_falls_back_to_identity(index: HistoryIndex, monkeypatch: Any) -> None:
    # Comparing the saved prefix as lists calls `==` on objects that are not the same one; a value
    # refusing it must not fail the save: the prefix is then compared object by object.
    monkeypatch.setattr('stepcore.engine._history.encode_message', lambda m: b'{"m":%d}' % id(m))
    table = NodeTable()
    first = [req('q'), returned(Refuses(), 'a'), res('r'), req('s')]
    delta = await diffed(index, 'r', first)
    index.commit(delta, table.write(delta))
    again = [first[0], returned(Refuses(), 'a'), *first[2:], res('t')]
    delta = await diffed(index, 'r', again)
    assert (delta.shared, len(delta.new_messages)) == (1, 4)


async def test_stamped_tail_mutated_in_place_is_detected(index: HistoryIndex) -> None:
    table = NodeTable()
    live = history(5)
    last = live[-1]
    assert isinstance(last, ModelRequest)
    _, first_head = await save(index, table, 'r', live)
    last.timestamp = T
    last.run_id = 'stamped'
    last.instructions = 'now filled in'
    delta, head = await save(index, table, 'r', live)
    assert (delta.shared, len(delta.new_messages)) == (4, 1)
    restored = await read(index, table, head, 5)
    assert restored == live
    before = await read(index, table, first_head, 5)
    before_last = before[-1]
    assert isinstance(before_last, ModelRequest)
    assert before_last.run_id is None


async def test_recheck_window_covers_the_last_saved_messages(index: HistoryIndex) -> None:
    assert TAIL_RECHECK >= 2  # pydantic-ai stamps the newest request, which can be second to last
    table = NodeTable()
    live = history(6)
    await save(index, table, 'r', live)
    second_to_last = live[-2]
    assert isinstance(second_to_last, ModelRequest)
    second_to_last.run_id = 'stamped'
    delta, head = await save(index, table, 'r', live)
    assert (delta.shared, len(delta.new_messages)) == (4, 2)
    assert await read(index, table, head, 6) == live


async def test_runs_are_indexed_separately(index: HistoryIndex) -> None:
    table = NodeTable()
    shared = history(3)
    await save(index, table, 'a', shared)
    delta, _ = await save(index, table, 'b', shared)
    assert (delta.parent, len(delta.new_messages)) == (None, 3)


async def test_an_uncommitted_delta_is_not_remembered(index: HistoryIndex) -> None:
    table = NodeTable()
    await save(index, table, 'r', history(2))
    await diffed(index, 'r', history(4))  # the write failed: no commit
    delta, _ = await save(index, table, 'r', history(4))
    assert (delta.parent, len(delta.new_messages)) == (1, 2)


async def test_a_growing_history_is_remembered_in_place_and_reads_back(index: HistoryIndex) -> None:
    # Each commit extends what is remembered rather than copying it; every save still hangs its
    # new messages off the right node, through growth, a rewritten tail and a shortened history.
    table = NodeTable()
    messages = history(2)
    heads: list[tuple[Hashable | None, list[ModelMessage]]] = []
    for step in range(30):
        if step == 10:
            messages = [*messages[:-1], res('rewritten tail')]
        elif step == 20:
            messages = messages[:7]
        else:
            messages = [*messages, req(f'q{step}'), res(f'a{step}')]
        delta, head = await save(index, table, 'r', messages)
        assert delta.total == len(messages)
        heads.append((head, list(messages)))
    for head, expected in heads:
        assert await read(index, table, head, len(expected)) == expected


def test_shares_prefix_compares_without_changing_the_owned_list() -> None:
    owned = history(6)
    kept = list(owned)
    grown = [*owned, res('x'), req('y')]
    assert shares_prefix(owned, grown, 6)
    assert shares_prefix(owned, [*history(6), res('x')], 6)  # equal objects count as the same
    assert shares_prefix(owned, [*owned[:4], req('other'), res('other')], 4)  # only `n` compared
    assert not shares_prefix(owned, [*owned[:3], req('other'), *owned[4:]], 6)
    assert not shares_prefix(owned, [*owned[:3], req('other'), *owned[4:]], 5)
    assert len(owned) == 6
    assert all(a is b for a, b in zip(owned, kept, strict=True))


def test_shares_prefix_falls_back_to_identity_when_equality_raises() -> None:
    refusing = returned(Refuses(), 'a')
    owned: list[ModelMessage] = [req('q'), refusing, res('r')]
    assert shares_prefix(owned, [owned[0], refusing, owned[2], req('s')], 3)
    assert not shares_prefix(owned, [owned[0], returned(Refuses(), 'a'), owned[2]], 3)
    assert owned[1] is refusing
    assert len(owned) == 3


async def test_the_saved_list_is_read_not_kept(index: HistoryIndex) -> None:
    # The index keeps a list of its own: what the caller does with its list after the save
    # does not change what the next save is compared with.
    table = NodeTable()
    given = history(6)
    await save(index, table, 'r', given)
    given[1] = res('changed after the save')
    given.append(req('appended after the save'))
    delta, head = await save(index, table, 'r', [*history(6), res('next')])
    assert (delta.shared, len(delta.new_messages)) == (6, 1)
    assert await read(index, table, head, 7) == [*history(6), res('next')]


async def test_equal_copies_become_the_remembered_objects_a_window_per_save(index: HistoryIndex) -> None:
    # After a history's messages are replaced by equal copies, each save points one window of
    # the remembered prefix at the objects it was given, so later saves find them by identity.
    table = NodeTable()
    size = 2 * REFRESH_WINDOW + 10
    await save(index, table, 'r', history(size))
    copies = history(size)
    saves = 0
    while True:
        copies = [*copies, res(f'grow{saves}')]
        delta, _ = await save(index, table, 'r', copies)
        saves += 1
        assert (delta.shared, len(delta.new_messages)) == (len(copies) - 1, 1)
        remembered = index._runs['r'].messages  # pyright: ignore[reportPrivateUsage]
        assert remembered == copies
        if all(a is b for a, b in zip(remembered, copies, strict=True)):
            break
        assert saves <= 3
    assert saves == 3


async def test_a_delta_diffed_before_another_commit_is_not_applied_over_it(index: HistoryIndex) -> None:
    # Two saves of one run diffed against the same remembered history: once the first commits,
    # the second cannot know what it still shares, so the run is forgotten and written whole next.
    table = NodeTable()
    await save(index, table, 'r', history(4))
    first = await diffed(index, 'r', history(6))
    second = await diffed(index, 'r', [*history(4), req('other'), res('branch')])
    index.commit(first, table.write(first))
    written = table.write(second)
    index.commit(second, written)
    assert await read(index, table, head_of(second, written), 6) == [*history(4), req('other'), res('branch')]
    delta, head = await save(index, table, 'r', history(8))
    assert len(delta.new_messages) == 8
    assert await read(index, table, head, 8) == history(8)


async def test_commit_checks_the_node_count(index: HistoryIndex) -> None:
    delta = await diffed(index, 'r', history(2))
    with pytest.raises(ValueError, match='1 node ids for 2 new messages'):
        index.commit(delta, [0])


async def test_forget_and_eviction_fall_back_to_a_full_write() -> None:
    index = HistoryIndex(MediaWalker(None), max_runs=2)
    table = NodeTable()
    for run_id in ('a', 'b'):
        await save(index, table, run_id, history(2))
    index.forget('a')
    delta, _ = await save(index, table, 'a', history(2))
    assert len(delta.new_messages) == 2
    await save(index, table, 'c', history(2))  # evicts the least recently saved run, 'b'
    delta, _ = await save(index, table, 'b', history(2))
    assert len(delta.new_messages) == 2
    delta, _ = await save(index, table, 'c', history(2))
    assert delta.new_messages == []


async def test_diff_of_plain_messages_is_ready_to_write(index: HistoryIndex) -> None:
    messages = history(3)
    delta = index.diff('r', messages)
    assert delta.walked
    assert delta.new_messages == [encode_message(m) for m in messages]
    assert delta.new_messages == (await diffed(HistoryIndex(MediaWalker(None)), 'r', messages)).new_messages


async def test_diff_leaves_media_to_walk_on_the_event_loop() -> None:
    media = InMemoryMediaStore()
    index = HistoryIndex(MediaWalker(media, threshold_bytes=100))
    messages: list[ModelMessage] = [req('x' * 500), res('short')]
    delta = index.diff('r', messages)
    assert not delta.walked  # the long prompt goes to the media store, which diff does not call
    assert delta.new_messages == [encode_message(m) for m in messages]
    assert not media.blobs
    await index.walk(delta)
    assert delta.walked
    assert b'x' * 500 not in delta.new_messages[0]
    assert delta.new_messages[1] == encode_message(messages[1])
    assert len(media.blobs) == 1
    table = NodeTable()
    ids = table.write(delta)
    index.commit(delta, ids)
    assert await read(index, table, head_of(delta, ids), 2) == messages


def test_walk_chain_returns_oldest_first() -> None:
    nodes: dict[Hashable, tuple[Hashable | None, bytes]] = {'x': (None, b'1'), 'y': ('x', b'2'), 'z': ('y', b'3')}
    assert walk_chain('z', 3, nodes.__getitem__) == [b'1', b'2', b'3']
    assert walk_chain('z', 2, nodes.__getitem__) == [b'2', b'3']
    assert walk_chain(None, 0, nodes.__getitem__) == []


def test_walk_chain_reports_a_broken_history() -> None:
    nodes: dict[Hashable, tuple[Hashable | None, bytes]] = {'y': (None, b'2')}
    with pytest.raises(LookupError, match='expected 3 messages, found 1'):
        walk_chain('y', 3, nodes.__getitem__)
