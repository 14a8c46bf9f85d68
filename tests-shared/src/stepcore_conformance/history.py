"""Long histories and history rewrites: every snapshot reads back exactly what was saved.

Stores keep history incrementally (only what is new since the previous save), so these tests aim
at what incremental schemes get wrong: compaction that shortens the history, an old message
replaced by a new object of the same length of history, a request pydantic-ai stamps in place
after it was saved, and message objects shared between runs.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage

from stepcore import SnapshotState, StepStore

from ._support import StoreFixtures, at, canonical, conversation, register, reply, snapshot, tool_exchange, user

__all__ = ('HistoryConformance',)


def _copy(messages: list[ModelMessage]) -> list[ModelMessage]:
    """An independent deep copy (through pydantic-ai's serializer) to compare against later."""
    return canonical(messages)


class HistoryConformance(StoreFixtures):
    """Exact round-trips of long and rewritten histories through `save_snapshot`."""

    async def test_long_growing_history_every_snapshot_exact(self, store: StepStore) -> None:
        run_id = await register(store)
        live: list[ModelMessage] = [user('start')]
        expected: list[list[ModelMessage]] = []
        for step in range(40):
            live.extend(tool_exchange(step, content=f'result {step} ' + 'x' * (step * 7)))
            state = SnapshotState.INTERRUPTED if step % 9 == 4 else SnapshotState.COMPLETE
            await store.save_snapshot(snapshot(run_id, live, step_index=step, state=state))
            expected.append(_copy(live))
            newest = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
            assert newest is not None
            assert newest.messages == expected[-1]
        listed = await store.list_snapshots(run_id=run_id, include_interrupted=True)
        assert [s.messages for s in listed] == expected
        assert [len(s.messages) for s in listed] == [1 + 2 * (step + 1) for step in range(40)]

    async def test_shortened_history_then_growth(self, store: StepStore) -> None:
        run_id = await register(store)
        live = conversation(6)
        await store.save_snapshot(snapshot(run_id, live, step_index=1))
        # Compaction: a summary replaces the old turns and keeps the last exchange.
        compacted: list[ModelMessage] = [user('summary of the earlier work'), *live[-2:]]
        await store.save_snapshot(snapshot(run_id, compacted, step_index=2))
        # Trimming without replacement: a strict prefix of the previous history.
        trimmed = compacted[:1]
        await store.save_snapshot(snapshot(run_id, trimmed, step_index=3))
        grown = [*trimmed, *tool_exchange(50), reply('done', 51)]
        await store.save_snapshot(snapshot(run_id, grown, step_index=4))
        listed = await store.list_snapshots(run_id=run_id)
        assert [s.messages for s in listed] == [conversation(6), _copy(compacted), _copy(trimmed), _copy(grown)]

    async def test_prefix_of_previous_history(self, store: StepStore) -> None:
        run_id = await register(store)
        live = conversation(5)
        await store.save_snapshot(snapshot(run_id, live, step_index=1))
        await store.save_snapshot(snapshot(run_id, live[:4], step_index=2))
        await store.save_snapshot(snapshot(run_id, live[:4], step_index=3))
        await store.save_snapshot(snapshot(run_id, live, step_index=4))
        listed = await store.list_snapshots(run_id=run_id)
        assert [s.messages for s in listed] == [
            conversation(5),
            conversation(5)[:4],
            conversation(5)[:4],
            conversation(5),
        ]

    async def test_same_length_rewrite_of_an_old_message(self, store: StepStore) -> None:
        run_id = await register(store)
        live = conversation(10)
        await store.save_snapshot(snapshot(run_id, live, step_index=1))
        rewritten = list(live)
        rewritten[3] = ModelResponse(parts=[TextPart(content='redacted')], model_name='kit-model', timestamp=at(3))
        await store.save_snapshot(snapshot(run_id, rewritten, step_index=2))
        # And back: the original objects again after a rewrite.
        await store.save_snapshot(snapshot(run_id, live, step_index=3))
        listed = await store.list_snapshots(run_id=run_id)
        assert [s.messages for s in listed] == [conversation(10), _copy(rewritten), conversation(10)]
        assert len(rewritten) == len(live)

    async def test_rewrite_of_the_first_message(self, store: StepStore) -> None:
        run_id = await register(store)
        live = conversation(4)
        await store.save_snapshot(snapshot(run_id, live))
        rewritten = [user('a different first prompt'), *live[1:]]
        await store.save_snapshot(snapshot(run_id, rewritten))
        listed = await store.list_snapshots(run_id=run_id)
        assert [s.messages for s in listed] == [conversation(4), _copy(rewritten)]

    async def test_equal_content_in_new_objects(self, store: StepStore) -> None:
        # A continued run loads its history from storage: new objects with the same content.
        run_id = await register(store)
        await store.save_snapshot(snapshot(run_id, conversation(5)))
        reloaded = [*conversation(5), *tool_exchange(5)]
        await store.save_snapshot(snapshot(run_id, reloaded))
        listed = await store.list_snapshots(run_id=run_id)
        assert [s.messages for s in listed] == [conversation(5), _copy(reloaded)]

    async def test_stamped_last_message_mutated_in_place_after_save(self, store: StepStore) -> None:
        run_id = await register(store)
        live = conversation(3)
        request = ModelRequest(parts=[UserPromptPart(content='next question', timestamp=at(9))])
        live.append(request)
        before = _copy(live)
        await store.save_snapshot(snapshot(run_id, live, step_index=1))
        # pydantic-ai stamps the request it sends after the snapshot that contains it was saved.
        request.timestamp = at(10)
        request.run_id = 'stamped-run-id'
        request.instructions = 'be brief'
        live.append(reply('answer', 11))
        after = _copy(live)
        await store.save_snapshot(snapshot(run_id, live, step_index=2))
        # Stamped again without growth: the history has the same length and the same objects.
        request.metadata = {'stamped': 'twice'}
        last = live[-1]
        assert isinstance(last, ModelResponse)
        last.usage = RequestUsage(input_tokens=5, output_tokens=7)
        again = _copy(live)
        await store.save_snapshot(snapshot(run_id, live, step_index=3))
        listed = await store.list_snapshots(run_id=run_id)
        assert [s.messages for s in listed] == [before, after, again]
        assert before != after != again

    async def test_message_objects_shared_between_runs(self, store: StepStore) -> None:
        # A fork starts a new run from another run's history objects.
        run_a, run_b = await register(store), await register(store)
        shared = conversation(3)
        await store.save_snapshot(snapshot(run_a, shared))
        fork = [*shared, user('forked question', 20)]
        await store.save_snapshot(snapshot(run_b, fork))
        await store.save_snapshot(snapshot(run_a, [*shared, *tool_exchange(3)]))
        a = await store.list_snapshots(run_id=run_a)
        b = await store.list_snapshots(run_id=run_b)
        assert [s.messages for s in a] == [conversation(3), [*conversation(3), *tool_exchange(3)]]
        assert [s.messages for s in b] == [_copy(fork)]

    async def test_every_part_kind_round_trips(self, store: StepStore) -> None:
        run_id = await register(store)
        messages: list[ModelMessage] = [
            ModelRequest(
                parts=[
                    SystemPromptPart(content='You are a librarian.', timestamp=at(0)),
                    UserPromptPart(content=['a list prompt', 'with two items'], timestamp=at(0)),
                ],
                instructions='answer with sources',
                timestamp=at(0),
                run_id='ctx-run',
                metadata={'nested': {'list': [1, 2], 'none': None}},
            ),
            ModelResponse(
                parts=[
                    ThinkingPart(content='let me think', signature='sig'),
                    TextPart(content='calling a tool'),
                    ToolCallPart(tool_name='search', args='{"q": "raw json string args"}', tool_call_id='c1'),
                    ToolCallPart(tool_name='search', args={'q': 'dict args', 'n': 3.5}, tool_call_id='c2'),
                ],
                usage=RequestUsage(input_tokens=10, output_tokens=20),
                model_name='kit-model',
                timestamp=at(1) + timedelta(microseconds=123456),
                provider_name='kit',
                provider_response_id='resp-1',
                finish_reason='tool_call',
            ),
            ModelRequest(
                parts=[
                    ToolReturnPart(tool_name='search', content={'rows': []}, tool_call_id='c1', timestamp=at(2)),
                    # An outcome every supported pydantic-ai release knows ('retried' came later).
                    ToolReturnPart(
                        tool_name='search', content='bad args', tool_call_id='c2', outcome='failed', timestamp=at(2)
                    ),
                ]
            ),
            ModelResponse(parts=[TextPart(content='ünïcode ✓ 𝄞 "quotes" \\ back\nslash')], timestamp=at(3)),
        ]
        await store.save_snapshot(snapshot(run_id, messages))
        latest = await store.latest_snapshot(run_id=run_id)
        assert latest is not None
        assert latest.messages == _copy(messages)
