"""Snapshots: copies on save, seq, state filtering, idempotency keys, reserved keys."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, TextPart, ToolReturnPart

from stepcore import ContinuableSnapshot, SnapshotState, SnapshotSummary, StepStore

from ._support import (
    StoreFixtures,
    at,
    conversation,
    new_id,
    register,
    reply,
    snapshot,
    tool_exchange,
    tool_return_content,
    user,
)

__all__ = ('RESERVED_KEY_PAYLOAD', 'SnapshotsConformance')

COMPLETE = SnapshotState.COMPLETE
INTERRUPTED = SnapshotState.INTERRUPTED

RESERVED_KEY_PAYLOAD: dict[str, Any] = {
    '__stepcore_media__': 'media+sha256://' + '0' * 64,
    '__stepcore_marker_format__': 999,
    '__stepcore_escaped__': {'__stepcore_media__': 'nested', 'plain': [1, 2.5, None, True]},
    'encoding': 'base64',
    'kind': 'binary',
    'data': 'not base64 at all!',
    'nested': [{'__stepcore_marker_format__': 'x'}, {'__stepcore_escaped__': None}],
}
"""Tool output that uses the media walker's reserved keys: stored data must never be taken for a marker."""


def _header(s: ContinuableSnapshot) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(s).items() if k not in ('messages', 'seq')}


class SnapshotsConformance(StoreFixtures):
    """`save_snapshot`, `latest_snapshot` and `list_snapshots`."""

    async def test_save_and_read_back_every_field(self, store: StepStore) -> None:
        run_id = await register(store)
        saved = snapshot(
            run_id,
            conversation(3),
            step_index=7,
            timestamp=at(7.654321),
            agent_name='librarian',
            conversation_id='conv',
            parent_run_id='parent',
            metadata={'k': 'v', 'ü': 'ß'},
            idempotency_key='save-1',
        )
        await store.save_snapshot(saved)
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert _header(latest) == _header(saved)
        assert latest.messages == saved.messages
        assert isinstance(latest.seq, int)
        listed = await store.list_snapshots(run_id=run_id)
        assert listed == [latest]

    async def test_snapshot_read_back_equals_the_snapshot_written(self, store: StepStore) -> None:
        # The store assigns `seq`; `==` leaves it out, so a read-back record equals what was written.
        run_id = await register(store)
        saved = snapshot(run_id, conversation(2), step_index=3, metadata={'k': 'v'}, idempotency_key='eq-1')
        await store.save_snapshot(saved)
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert saved.seq is None
        assert isinstance(latest.seq, int)
        assert latest == saved
        assert await store.list_snapshots(run_id=run_id) == [saved]
        assert latest != dataclasses.replace(saved, step_index=4), '== must still compare the other fields'

    async def test_reads_of_unknown_run(self, store: StepStore) -> None:
        missing = new_id('missing')
        assert await store.latest_snapshot(run_id=missing) is None
        assert await store.latest_snapshot(run_id=missing, include_interrupted=True) is None
        assert await store.list_snapshots(run_id=missing) == []

    async def test_empty_history_round_trips(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, []))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == []

    async def test_save_copies_the_messages(self, store: StepStore) -> None:
        run_id = await register(store)
        messages = conversation(2)
        expected = conversation(2)
        await store.save_snapshot(snapshot(run_id, messages))
        # Mutate everything the caller still holds: the list, a part's content, a nested dict.
        messages.append(reply('appended after save'))
        first = messages[0]
        assert isinstance(first, ModelRequest)
        first.parts = [*first.parts, ToolReturnPart(tool_name='x', content='late', tool_call_id='late')]
        last_request = messages[-2]
        assert isinstance(last_request, ModelRequest)
        part = last_request.parts[0]
        assert isinstance(part, ToolReturnPart)
        part.content = cast(Any, 'mutated after save')
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == expected

    async def test_reads_return_independent_copies(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(1), metadata={'a': '1'}))
        first = await store.latest_snapshot(run_id=run_id)
        assert first is not None
        first.messages.append(reply('appended to a read copy'))
        first.metadata['a'] = 'changed'
        response = first.messages[1]
        assert not isinstance(response, ModelRequest)
        response.parts = [TextPart(content='replaced in a read copy')]
        second = await store.latest_snapshot(run_id=run_id)
        assert second is not None
        assert second.messages == conversation(1)
        assert second.metadata == {'a': '1'}

    async def test_seq_is_per_run_and_strictly_increasing(self, store: StepStore) -> None:
        run_id = await register(store)
        for step in range(6):
            await store.save_snapshot(snapshot(run_id, conversation(step), step_index=step))
        listed = await store.list_snapshots(run_id=run_id)
        seqs = [s.seq for s in listed]
        assert all(isinstance(s, int) for s in seqs), seqs
        ints = [s for s in seqs if s is not None]
        assert ints == sorted(set(ints))
        assert len(ints) == 6
        assert [s.step_index for s in listed] == list(range(6))
        assert [s.messages for s in listed] == [conversation(step) for step in range(6)]

    async def test_snapshot_seq_given_by_the_caller_is_replaced(self, store: StepStore) -> None:
        run_id = await register(store)
        for step in range(3):
            await store.save_snapshot(snapshot(run_id, conversation(step), step_index=step, seq=1))
        seqs = [s.seq for s in await store.list_snapshots(run_id=run_id)]
        assert len(set(seqs)) == 3, f'the store kept the seq the caller set: {seqs}'
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.step_index == 2

    async def test_same_step_index_saved_twice_keeps_both_in_write_order(self, store: StepStore) -> None:
        # One run id reused by two Agent.run calls: step numbering restarts, seq does not.
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(1, tag='first call'), step_index=0))
        await store.save_snapshot(snapshot(run_id, conversation(1, tag='second call'), step_index=0))
        listed = await store.list_snapshots(run_id=run_id)
        assert [s.messages for s in listed] == [conversation(1, tag='first call'), conversation(1, tag='second call')]
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == conversation(1, tag='second call')

    async def test_latest_skips_interrupted_unless_asked(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(1), step_index=1, state=COMPLETE))
        await store.save_snapshot(snapshot(run_id, conversation(2), step_index=2, state=COMPLETE))
        await store.save_snapshot(snapshot(run_id, conversation(3), step_index=3, state=INTERRUPTED))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert (latest.step_index, latest.state) == (2, COMPLETE)
        assert latest.messages == conversation(2)
        newest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
        assert newest is not None
        assert (newest.step_index, newest.state) == (3, INTERRUPTED)
        assert newest.messages == conversation(3)

    async def test_latest_with_only_interrupted_snapshots(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(1), state=INTERRUPTED))
        assert await store.latest_snapshot(run_id=run_id) is None
        newest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
        assert newest is not None
        assert newest.state is INTERRUPTED

    async def test_complete_after_interrupted_is_latest_either_way(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(1), step_index=1, state=INTERRUPTED))
        await store.save_snapshot(snapshot(run_id, conversation(2), step_index=2, state=COMPLETE))
        for include in (False, True):
            latest = await store.latest_snapshot(run_id=run_id, include_interrupted=include)
            assert latest is not None
            assert latest.step_index == 2

    async def test_list_snapshots_gives_complete_ones_unless_asked(self, store: StepStore) -> None:
        run_id = await register(store)
        states = [COMPLETE, INTERRUPTED, INTERRUPTED, COMPLETE, INTERRUPTED]
        for step, state in enumerate(states):
            await store.save_snapshot(snapshot(run_id, conversation(step), step_index=step, state=state))
        listed = await store.list_snapshots(run_id=run_id)
        assert [(s.step_index, s.state) for s in listed] == [(0, COMPLETE), (3, COMPLETE)], (
            'list_snapshots(run_id) must give only the complete snapshots, in write order'
        )
        assert [s.messages for s in listed] == [conversation(0), conversation(3)]
        assert await store.list_snapshots(run_id=run_id, include_interrupted=False) == listed
        everything = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        assert [s.state for s in everything] == states, (
            'list_snapshots(run_id, include_interrupted=True) must give every snapshot, in write order'
        )
        assert [s.step_index for s in everything] == list(range(5))
        assert [s.messages for s in everything] == [conversation(step) for step in range(5)]

    async def test_list_snapshots_of_a_run_with_only_interrupted_ones(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(1), state=INTERRUPTED))
        assert await store.list_snapshots(run_id=run_id) == []
        assert [s.state for s in await store.list_snapshots(run_id=run_id, include_interrupted=True)] == [INTERRUPTED]

    async def test_applied_snapshot_key_is_suppressed(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(1), step_index=1, idempotency_key='k1'))
        # A replay of the same save carrying different (newer) content is still suppressed.
        await store.save_snapshot(snapshot(run_id, conversation(5), step_index=5, idempotency_key='k1'))
        await store.save_snapshot(snapshot(run_id, conversation(2), step_index=2, idempotency_key='k2'))
        await store.save_snapshot(
            snapshot(run_id, conversation(6), step_index=6, state=INTERRUPTED, idempotency_key='k2')
        )
        listed = await store.list_snapshots(run_id=run_id)
        assert [(s.step_index, s.idempotency_key) for s in listed] == [(1, 'k1'), (2, 'k2')]
        assert [s.messages for s in listed] == [conversation(1), conversation(2)]
        newest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
        assert newest is not None
        assert newest.step_index == 2

    async def test_none_idempotency_key_always_saves(self, store: StepStore) -> None:
        run_id = await register(store)
        same = snapshot(run_id, conversation(1))
        for _ in range(3):
            await store.save_snapshot(same)
        listed = await store.list_snapshots(run_id=run_id)
        assert len(listed) == 3
        assert len({s.seq for s in listed}) == 3

    async def test_snapshot_idempotency_keys_are_scoped_to_their_run(self, store: StepStore) -> None:
        run_a, run_b = await register(store), await register(store)
        await store.save_snapshot(snapshot(run_a, conversation(1), idempotency_key='shared'))
        await store.save_snapshot(snapshot(run_b, conversation(2), idempotency_key='shared'))
        latest_b = await store.latest_snapshot(run_id=run_b)
        assert latest_b is not None
        assert latest_b.messages == conversation(2)

    async def test_runs_keep_separate_snapshots(self, store: StepStore) -> None:
        run_a, run_b = await register(store), await register(store)
        await store.save_snapshot(snapshot(run_a, conversation(2, tag='a')))
        await store.save_snapshot(snapshot(run_b, conversation(1, tag='b')))
        await store.save_snapshot(snapshot(run_a, conversation(3, tag='a')))
        assert [s.messages for s in await store.list_snapshots(run_id=run_b)] == [conversation(1, tag='b')]
        assert [len(s.messages) for s in await store.list_snapshots(run_id=run_a)] == [5, 7]

    async def test_payload_using_reserved_marker_keys_round_trips_exactly(self, store: StepStore) -> None:
        run_id = await register(store)
        messages: list[ModelMessage] = [
            user('__stepcore_media__ appears in plain text too'),
            *tool_exchange(1, content=RESERVED_KEY_PAYLOAD),
            *tool_exchange(2, content=[RESERVED_KEY_PAYLOAD, {'__stepcore_media__': None}]),
        ]
        await store.save_snapshot(snapshot(run_id, messages))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == messages
        assert tool_return_content(latest.messages[2]) == RESERVED_KEY_PAYLOAD

    async def test_snapshot_summaries_describe_snapshots_without_their_messages(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(1), step_index=1, metadata={'k': 'v'}))
        await store.save_snapshot(snapshot(run_id, conversation(2)[:-1], step_index=2, state=INTERRUPTED))
        await store.save_snapshot(snapshot(run_id, conversation(3), step_index=3, idempotency_key='third'))
        every = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        summaries = await store.list_snapshot_summaries(run_id, include_interrupted=True)
        assert summaries == [SnapshotSummary.of(s) for s in every]
        assert [(s.step_index, s.state, s.message_count) for s in summaries] == [
            (1, COMPLETE, len(conversation(1))),
            (2, INTERRUPTED, len(conversation(2)) - 1),
            (3, COMPLETE, len(conversation(3))),
        ]
        assert summaries[0].metadata == {'k': 'v'}
        assert summaries[2].idempotency_key == 'third'
        complete = await store.list_snapshot_summaries(run_id)
        assert [s.seq for s in complete] == [s.seq for s in await store.list_snapshots(run_id=run_id)]
        assert await store.list_snapshot_summaries(new_id('never-written')) == []

    async def test_get_snapshot_reads_one_snapshot_by_seq(self, store: StepStore) -> None:
        run_id = await register(store)
        for step in range(1, 4):
            state = INTERRUPTED if step == 2 else COMPLETE
            await store.save_snapshot(
                snapshot(run_id, conversation(step, tag=f's{step}'), step_index=step, state=state)
            )
        every = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        for stored in every:
            assert stored.seq is not None
            found = await store.get_snapshot(run_id, stored.seq)
            assert found == stored
            assert found is not None
            assert found.seq == stored.seq
            assert found.messages == stored.messages
        missing = max(s.seq or 0 for s in every) + 100
        assert await store.get_snapshot(run_id, missing) is None
        assert await store.get_snapshot(new_id('never-written'), 1) is None
        with pytest.raises(ValueError, match='seq='):
            await store.get_snapshot(run_id, 'one')  # pyright: ignore[reportArgumentType]

    async def test_get_snapshot_messages_reads_a_part_of_one_snapshot(self, store: StepStore) -> None:
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(1), step_index=1))
        await store.save_snapshot(snapshot(run_id, conversation(3), step_index=3, state=INTERRUPTED))
        first, newest = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        assert first.seq is not None
        assert newest.seq is not None
        everything = conversation(3)

        async def part(seq: int, start: int = 0, stop: int | None = None) -> tuple[int, list[ModelMessage]]:
            found = await store.get_snapshot_messages(run_id, seq, start=start, stop=stop)
            assert found is not None, f'snapshot {seq} is stored'
            assert found.stop == found.start + len(found.messages)
            assert found.summary == SnapshotSummary.of(newest if seq == newest.seq else first)
            return found.start, found.messages

        assert await part(newest.seq, 2, 5) == (2, everything[2:5])
        assert await part(newest.seq) == (0, everything)
        assert await part(newest.seq, len(everything) - 1) == (len(everything) - 1, everything[-1:])
        assert await part(newest.seq, 100, 200) == (len(everything), [])
        assert await part(newest.seq, 4, 1) == (4, [])
        assert await part(first.seq, stop=2) == (0, conversation(1)[:2])
        whole = await store.get_snapshot_messages(run_id, newest.seq)
        assert whole is not None
        assert whole.summary.message_count == len(everything)

        assert await store.get_snapshot_messages(run_id, newest.seq + 100) is None
        assert await store.get_snapshot_messages(new_id('never-written'), 1) is None
        with pytest.raises(ValueError, match='start=-1'):
            await store.get_snapshot_messages(run_id, newest.seq, start=-1)
        with pytest.raises(ValueError, match="stop='2'"):
            await store.get_snapshot_messages(run_id, newest.seq, stop='2')  # pyright: ignore[reportArgumentType]
        with pytest.raises(ValueError, match='seq='):
            await store.get_snapshot_messages(run_id, 'one')  # pyright: ignore[reportArgumentType]

    async def test_shared_message_count_counts_what_two_snapshots_have_in_common(self, store: StepStore) -> None:
        run_id = await register(store)
        rewritten: list[ModelMessage] = [*conversation(2)[:3], user('a different turn', 9)]
        await store.save_snapshot(snapshot(run_id, conversation(1), step_index=1))
        await store.save_snapshot(snapshot(run_id, conversation(3), step_index=3))
        await store.save_snapshot(snapshot(run_id, rewritten, step_index=4, state=INTERRUPTED))
        await store.save_snapshot(snapshot(run_id, conversation(1, tag='other'), step_index=5))
        one, three, rewrite, other = [
            s.seq or 0 for s in await store.list_snapshots(run_id=run_id, include_interrupted=True)
        ]
        # a history that grew shares all of the shorter one, whichever way it is asked
        assert await store.shared_message_count(run_id, three, one) == len(conversation(1))
        assert await store.shared_message_count(run_id, one, three) == len(conversation(1))
        assert await store.shared_message_count(run_id, three, three) == len(conversation(3))
        # a rewritten history shares at most its equal leading messages; nothing when the first differs
        assert await store.shared_message_count(run_id, rewrite, three) <= 3
        assert await store.shared_message_count(run_id, other, three) == 0
        with pytest.raises(LookupError, match=f'seq {other + 100}'):
            await store.shared_message_count(run_id, three, other + 100)
        with pytest.raises(ValueError, match='seq='):
            await store.shared_message_count(run_id, three, 'one')  # pyright: ignore[reportArgumentType]
