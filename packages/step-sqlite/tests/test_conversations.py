"""Conversation heads: revisions, search, naming, deletion, busy detection, concurrency."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from pydantic_ai.messages import (
    BinaryContent,
    BinaryImage,
    CompactionPart,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextContent,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from step_sqlite import SqliteStepStore
from step_sqlite.conversations import (
    ConversationConflict,
    ConversationSummary,
    SqliteConversationStore,
)
from stepcore import ContinuableSnapshot, InMemoryStepStore, RunRecord, StepEvent
from stepcore.store.models import EventKind


def turn(prompt: str, answer: str) -> list[ModelMessage]:
    return [ModelRequest(parts=[UserPromptPart(prompt)]), ModelResponse(parts=[TextPart(answer)])]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / 'chat.db'


@pytest.fixture
async def conversations(db_path: Path):
    store = SqliteConversationStore(database=db_path)
    yield store
    await store.aclose()


def new(conversation_id: str, **fields: object) -> ConversationSummary:
    return ConversationSummary.model_validate({'conversation_id': conversation_id, **fields})


async def test_save_then_get_round_trips_and_counts_revisions(conversations: SqliteConversationStore) -> None:
    messages = turn('hello there', 'general kenobi')
    first = await conversations.save(summary=new('c1'), messages=messages)
    assert first.revision == 1
    assert first.message_count == 2
    saved = await conversations.get(conversation_id='c1')
    assert saved is not None
    assert saved.messages == messages
    assert saved.summary == first
    more = [*messages, *turn('again', 'sure')]
    second = await conversations.save(summary=first, messages=more)
    assert second.revision == 2
    assert second.created_at == first.created_at
    again = await conversations.get(conversation_id='c1')
    assert again is not None
    assert again.messages == more
    assert await conversations.get(conversation_id='missing') is None


async def test_large_parts_are_externalized_and_restored_exactly(
    conversations: SqliteConversationStore, db_path: Path
) -> None:
    big_text = 'x' * (70 * 1024)
    image = BinaryImage(data=bytes(range(256)) * 40, media_type='image/png')
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(['look at this', image])]),
        ModelResponse(parts=[ToolCallPart('read', {'path': 'a'}, tool_call_id='t1')]),
        ModelRequest(parts=[ToolReturnPart('read', big_text, tool_call_id='t1')]),
        ModelResponse(parts=[TextPart('done')]),
    ]
    await conversations.save(summary=new('media'), messages=messages)
    saved = await conversations.get(conversation_id='media')
    assert saved is not None
    assert saved.messages == messages
    with sqlite3.connect(db_path) as raw:
        (body,) = raw.execute("SELECT messages FROM conversations WHERE conversation_id = 'media'").fetchone()
    assert big_text not in body
    assert 'media+sha256://' in body


async def test_stale_writer_and_deleted_conversation_conflict(conversations: SqliteConversationStore) -> None:
    first = await conversations.save(summary=new('c'), messages=turn('a', 'b'))
    accepted = turn('a', 'c')
    await conversations.save(summary=first, messages=accepted)
    with pytest.raises(ConversationConflict, match='based on revision 1 but revision 2'):
        await conversations.save(summary=first, messages=turn('a', 'stale'))
    current = await conversations.get(conversation_id='c')
    assert current is not None
    assert current.messages == accepted  # the stale write changed nothing
    await conversations.delete(source=current.summary)
    with pytest.raises(ConversationConflict, match='deleted'):
        await conversations.save(summary=current.summary, messages=turn('a', 'ghost'))
    assert await conversations.get(conversation_id='c') is None


async def test_listing_is_newest_first_paginated_and_loads_no_messages(
    conversations: SqliteConversationStore,
) -> None:
    summaries = [await conversations.save(summary=new(f'c{i}'), messages=turn(f'q{i}', f'a{i}')) for i in range(5)]
    # touching c1 makes it the most recently active
    await conversations.save(summary=summaries[1], messages=turn('q1', 'changed'))
    listed = await conversations.listing()
    assert [s.conversation_id for s in listed] == ['c1', 'c4', 'c3', 'c2', 'c0']
    page = await conversations.listing(limit=2, offset=1)
    assert [s.conversation_id for s in page] == ['c4', 'c3']
    assert all(isinstance(s, ConversationSummary) for s in listed)
    with pytest.raises(ValueError, match='limit=-1'):
        await conversations.listing(limit=-1)


async def test_search_covers_user_assistant_metadata_with_case_folding(
    conversations: SqliteConversationStore,
) -> None:
    await conversations.save(summary=new('german'), messages=turn('Where is the Straße?', 'Around the corner'))
    await conversations.save(summary=new('answer'), messages=turn('hi', 'The ÉCOLE opens at nine'))
    await conversations.save(
        summary=new('meta', metadata={'project': 'Apollo Guidance'}), messages=turn('unrelated', 'words')
    )
    multimodal = [
        ModelRequest(
            parts=[
                UserPromptPart(
                    ['first the picture', BinaryContent(b'\x89PNG', media_type='image/png'), TextContent('ZEBRA notes')]
                )
            ]
        ),
        ModelResponse(parts=[TextPart('ok')]),
    ]
    await conversations.save(summary=new('multimodal'), messages=multimodal)

    async def ids(query: str) -> set[str]:
        return {s.conversation_id for s in await conversations.listing(query=query)}

    assert await ids('STRASSE') == {'german'}
    assert await ids('école') == {'answer'}
    assert await ids('apollo guid') == {'meta'}
    assert await ids('zebra') == {'multimodal'}
    assert await ids('the picture') == {'multimodal'}
    assert await ids('ok') == {'multimodal'}  # a two-character query is searched too
    assert await ids('nothing like this') == set()


async def test_search_skips_tool_output_reasoning_and_compacted_history(
    conversations: SqliteConversationStore,
) -> None:
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart('ancient prompt about walruses')]),
        ModelResponse(parts=[ThinkingPart('secret musing about penguins'), ToolCallPart('lookup', {'q': 'x'})]),
        ModelRequest(parts=[ToolReturnPart('lookup', 'tool output mentioning flamingos', tool_call_id='t')]),
        ModelResponse(
            parts=[CompactionPart('summary of the walrus talk', provider_name='anthropic'), TextPart('kept')]
        ),
        ModelRequest(parts=[UserPromptPart('fresh question about otters')]),
        ModelResponse(parts=[TextPart('otters hold hands')]),
    ]
    await conversations.save(summary=new('c'), messages=messages)

    async def hits(query: str) -> int:
        return len(await conversations.listing(query=query))

    assert await hits('otters') == 1
    assert await hits('kept') == 1
    assert await hits('walruses') == 0  # before the compaction
    assert await hits('penguins') == 0  # reasoning
    assert await hits('flamingos') == 0  # tool output


async def test_naming_rules(conversations: SqliteConversationStore) -> None:
    source = await conversations.save(summary=new('c'), messages=turn('plan a trip', 'sure'))
    named = await conversations.name(source=source, title='Trip plan', subtitle='to Rome', tags=['travel'])
    assert named is not None
    assert (named.title, named.subtitle, named.tags, named.title_source) == (
        'Trip plan',
        'to Rome',
        ['travel'],
        'generated',
    )
    assert named.updated_at == source.updated_at  # naming is not activity
    assert named.revision == source.revision
    assert named.named_at_revision == source.revision

    # a name computed from an older name revision is refused
    assert await conversations.name(source=source, title='Older name') is None
    # a name computed from older content is refused
    newer = await conversations.save(summary=named, messages=turn('plan a trip to Rome', 'sure'))
    assert await conversations.name(source=named, title='From old content') is None
    # a manual title wins and a generated name cannot replace it
    manual = await conversations.name(source=newer, title='My Rome trip', manual=True)
    assert manual is not None
    assert manual.title_source == 'manual'
    assert await conversations.name(source=manual, title='Generated again') is None
    current = await conversations.get(conversation_id='c')
    assert current is not None
    assert current.summary.title == 'My Rome trip'
    # a content save keeps the name
    saved = await conversations.save(summary=current.summary, messages=turn('x', 'y'))
    assert saved.title == 'My Rome trip'


async def test_unknown_metadata_schema_version_is_rejected(
    conversations: SqliteConversationStore, db_path: Path
) -> None:
    summary = await conversations.save(summary=new('c'), messages=turn('a', 'b'))
    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE conversations SET meta_version = 99 WHERE conversation_id = 'c'")
    with pytest.raises(ValueError, match='metadata schema version 99'):
        await conversations.get(conversation_id='c')
    with pytest.raises(ValueError, match='metadata schema version 99'):
        await conversations.listing()
    with pytest.raises(ValueError, match='metadata schema version 99'):
        await conversations.save(summary=summary, messages=turn('a', 'c'))


async def test_delete_removes_conversation_and_its_runs_but_keeps_media(db_path: Path) -> None:
    steps = SqliteStepStore(database=db_path)
    conversations = SqliteConversationStore(database=db_path)
    try:
        await steps.register_run(RunRecord(run_id='r1', conversation_id='c'))
        await steps.register_run(RunRecord(run_id='other', conversation_id='keep'))
        await steps.append_event(StepEvent(run_id='r1', kind=EventKind.RUN_STARTED, step_index=0))
        image = BinaryImage(data=b'image-bytes' * 7_000, media_type='image/png')  # over the 64 KiB media threshold
        messages: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart(['see', image])]),
            ModelResponse(parts=[TextPart('seen')]),
        ]
        summary = await conversations.save(summary=new('c'), messages=messages)
        with sqlite3.connect(db_path) as raw:
            (media_before,) = raw.execute('SELECT count(*) FROM media').fetchone()
        assert media_before >= 1

        await conversations.delete(source=summary)

        assert await conversations.get(conversation_id='c') is None
        assert await steps.get_run('r1') is None
        assert await steps.list_events('r1') == []
        assert await steps.get_run('other') is not None
        with sqlite3.connect(db_path) as raw:
            (media_after,) = raw.execute('SELECT count(*) FROM media').fetchone()
        assert media_after == media_before
    finally:
        await conversations.aclose()
        await steps.aclose()


async def test_stale_delete_is_refused(conversations: SqliteConversationStore) -> None:
    first = await conversations.save(summary=new('c'), messages=turn('a', 'b'))
    await conversations.save(summary=first, messages=turn('a', 'c'))
    with pytest.raises(ConversationConflict):
        await conversations.delete(source=first)
    assert await conversations.get(conversation_id='c') is not None


async def test_busy_while_a_live_local_writer_holds_it(conversations: SqliteConversationStore, db_path: Path) -> None:
    summary = await conversations.save(summary=new('c'), messages=turn('a', 'b'), in_progress=True)
    assert summary.busy
    assert summary.writer_pid == os.getpid()
    assert summary.outcome == 'running'
    still = await conversations.save(summary=summary, messages=turn('a', 'c'))
    assert (still.busy, still.outcome, still.writer_pid) == (True, 'running', os.getpid()), 'kept as the summary says'
    done = await conversations.save(summary=still, messages=turn('a', 'd'), in_progress=False)
    assert not done.busy
    assert done.writer_pid is None
    assert done.outcome == 'ready'

    finished = await anyio.run_process([sys.executable, '-c', 'import os; print(os.getpid())'])
    dead_pid = int(finished.stdout)
    with sqlite3.connect(db_path) as raw:
        raw.execute(
            "UPDATE conversations SET owner_pid = ?, outcome = 'running' WHERE conversation_id = 'c'", (dead_pid,)
        )
    (listed,) = await conversations.listing()
    assert listed.writer_pid == dead_pid
    assert not listed.busy


async def test_database_file_is_owner_only(conversations: SqliteConversationStore, db_path: Path) -> None:
    await conversations.listing()
    assert stat.S_IMODE(db_path.stat().st_mode) == 0o600


WRITER = textwrap.dedent(
    """
    import sys, time, pathlib, anyio
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
    from step_sqlite.conversations import ConversationConflict, SqliteConversationStore

    db, go, name = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]

    async def main() -> None:
        store = SqliteConversationStore(database=db)
        current = await store.get(conversation_id='shared')
        pathlib.Path(go.parent / f'{name}.ready').write_text('ready')
        while not go.exists():
            time.sleep(0.005)
        messages = [ModelRequest(parts=[UserPromptPart('q')]), ModelResponse(parts=[TextPart(name)])]
        try:
            await store.save(summary=current.summary, messages=messages)
        except ConversationConflict:
            print('conflict')
        else:
            print('won')
        await store.aclose()

    anyio.run(main)
    """
)


async def test_two_processes_saving_the_same_revision_exactly_one_wins(
    conversations: SqliteConversationStore, db_path: Path, tmp_path: Path
) -> None:
    await conversations.save(summary=new('shared'), messages=turn('q', 'start'))
    go = tmp_path / 'go'
    names = ('alpha', 'beta')

    def race() -> dict[str, str]:
        procs = [
            subprocess.Popen(
                [sys.executable, '-c', WRITER, str(db_path), str(go), name], stdout=subprocess.PIPE, text=True
            )
            for name in names
        ]
        deadline = time.monotonic() + 60
        while not all((tmp_path / f'{n}.ready').exists() for n in names):
            assert time.monotonic() < deadline, 'the writer processes did not get ready'
            time.sleep(0.01)
        go.write_text('go')
        outcomes: dict[str, str] = {}
        for name, proc in zip(names, procs, strict=True):
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0
            outcomes[name] = out.strip()
        return outcomes

    outcomes = await anyio.to_thread.run_sync(race)
    assert sorted(outcomes.values()) == ['conflict', 'won']
    winner = next(n for n, o in outcomes.items() if o == 'won')
    saved = await conversations.get(conversation_id='shared')
    assert saved is not None
    assert saved.summary.revision == 2
    answer = saved.messages[-1]
    assert isinstance(answer, ModelResponse)
    assert answer.parts == [TextPart(winner)]


class _DeleteRecorder(InMemoryStepStore):
    """An in-memory step store noting the runs deleted through it."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[str] = []

    async def delete_run(self, run_id: str) -> bool:
        self.deleted.append(run_id)
        return await super().delete_run(run_id)


async def test_delete_goes_through_the_step_stores_delete_run(db_path: Path) -> None:
    steps = _DeleteRecorder()
    for run_id, conversation_id in (('r1', 'c'), ('r2', 'c'), ('other', 'keep')):
        await steps.register_run(RunRecord(run_id=run_id, conversation_id=conversation_id))
    async with SqliteConversationStore(database=db_path, step_store=steps) as conversations:
        summary = await conversations.save(summary=new('c'), messages=turn('hi', 'hello'))
        await conversations.delete(source=summary)
    assert steps.deleted == ['r1', 'r2']
    assert [r.run_id for r in await steps.list_runs()] == ['other']
    with sqlite3.connect(db_path) as raw:
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert 'runs' not in tables, 'runs living in another store: no step tables are created in this database'


async def test_delete_can_leave_runs_alone(db_path: Path) -> None:
    steps = SqliteStepStore(database=db_path)
    try:
        await steps.register_run(RunRecord(run_id='r1', conversation_id='c'))
        async with SqliteConversationStore(database=db_path, step_store=None) as conversations:
            summary = await conversations.save(summary=new('c'), messages=turn('hi', 'hello'))
            await conversations.delete(source=summary)
            assert await conversations.get(conversation_id='c') is None
        assert await steps.get_run('r1') is not None
    finally:
        await steps.aclose()


async def test_a_run_deleted_with_its_conversation_can_be_written_again(db_path: Path) -> None:
    steps = SqliteStepStore(database=db_path)
    conversations = SqliteConversationStore(database=db_path)
    try:
        history = turn('first', 'answer')
        await steps.register_run(RunRecord(run_id='r1', conversation_id='c'))
        await steps.save_snapshot(ContinuableSnapshot(run_id='r1', messages=history, step_index=0))
        summary = await conversations.save(summary=new('c'), messages=history)
        await conversations.delete(source=summary)
        assert await steps.latest_snapshot('r1') is None

        # The same store instance remembers r1's history; its nodes are gone, so it must not build on them.
        longer = [*history, *turn('second', 'more')]
        await steps.register_run(RunRecord(run_id='r1', conversation_id='c'))
        await steps.save_snapshot(ContinuableSnapshot(run_id='r1', messages=longer, step_index=0))
        latest = await steps.latest_snapshot('r1')
        assert latest is not None
        assert latest.messages == longer
    finally:
        await conversations.aclose()
        await steps.aclose()


async def test_media_store_takes_auto_none_or_a_media_store_and_refuses_anything_else(db_path: Path) -> None:
    auto = SqliteConversationStore(database=db_path, media_store='auto')
    assert auto.media_store is not None
    assert SqliteConversationStore(database=db_path, media_store=None).media_store is None
    with pytest.raises(ValueError, match=r"SqliteConversationStore: media_store='disk' is not a media store"):
        SqliteConversationStore(database=db_path, media_store='disk')  # type: ignore[arg-type]
