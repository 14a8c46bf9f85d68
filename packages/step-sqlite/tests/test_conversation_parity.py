"""Conversation heads as pydantic-ai-harness users know them: its summary fields, `conversation_text`,
`ensure_inactive` against a real second process, archiving, and databases of the previous layout."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import signal
import sqlite3
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    CompactionPart,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextContent,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_sqlite import (
    ConversationConflict,
    ConversationSummary,
    GitCheckout,
    SqliteConversationStore,
    SqliteStepStore,
    conversation_models,
    conversation_text,
    ensure_inactive,
)
from step_sqlite.conversation_schema import CONVERSATIONS
from stepcore import StepPersistence
from stepcore.store.codec import encode_message

HARNESS_SUMMARY_FIELDS = (
    'schema_version',
    'id',
    'workspace',
    'checkout',
    'updated_at',
    'revision',
    'title',
    'subtitle',
    'tags',
    'title_source',
    'naming_version',
    'named_revision',
    'model',
    'outcome',
    'run_id',
    'owner_pid',
    'message_count',
    'total_tokens',
    'naming_tokens',
    'archived_at',
)
"""Every field of pydantic-ai-harness's `ConversationSummary`."""


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


# -- the summary -----------------------------------------------------------------------------


def test_a_summary_answers_to_every_harness_field_name() -> None:
    summary = ConversationSummary(workspace='/src/app')
    missing = [name for name in HARNESS_SUMMARY_FIELDS if not hasattr(summary, name)]
    assert missing == []
    assert summary.id == summary.conversation_id
    assert len(summary.id) == 36, 'a new summary gets a random UUID, as in the harness'
    assert ConversationSummary(workspace='/src/app').id != summary.id
    assert (summary.outcome, summary.owner_pid, summary.naming_version, summary.named_revision) == ('ready', None, 0, 0)


def test_harness_and_our_names_are_one_field() -> None:
    theirs = ConversationSummary(
        id='c1', owner_pid=42, naming_version=3, named_revision=2, title_source='user', tags=('a', 'b')
    )
    ours = ConversationSummary(
        conversation_id='c1',
        writer_pid=42,
        name_revision=3,
        named_at_revision=2,
        title_source='manual',
        tags=['a', 'b'],
    )
    assert theirs == ours
    assert (theirs.id, theirs.owner_pid, theirs.naming_version, theirs.named_revision) == ('c1', 42, 3, 2)
    assert ConversationSummary(title_source='fallback').title_source is None
    # a summary dumped by the harness (a dataclass) validates as one of ours
    dumped = {
        'schema_version': 1,
        'id': 'c2',
        'workspace': '/w',
        'checkout': {'repository': '/w/.git', 'name': 'w', 'root': '/w', 'branch': 'main'},
        'title': 'New session',
        'tags': ['x'],
        'title_source': 'generated',
        'owner_pid': 7,
        'outcome': 'running',
    }
    validated = ConversationSummary.model_validate(dumped)
    assert (validated.id, validated.owner_pid, validated.outcome) == ('c2', 7, 'running')
    assert validated.checkout == GitCheckout(repository='/w/.git', name='w', root='/w', branch='main')


def test_two_spellings_with_different_values_are_refused() -> None:
    with pytest.raises(ValueError, match=r"conversation_id='a' and id='b' name the same field"):
        ConversationSummary(conversation_id='a', id='b')
    with pytest.raises(ValueError, match='writer_pid=1 and owner_pid=2'):
        ConversationSummary(writer_pid=1, owner_pid=2)
    with pytest.raises(ValueError, match='schema_version'):
        ConversationSummary.model_validate({'schema_version': 2, 'id': 'c'})


def test_the_constructor_type_checkers_see_takes_every_field_by_name() -> None:
    tree = ast.parse(Path(conversation_models.__file__).read_text(encoding='utf-8'))
    summary_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == 'ConversationSummary')
    init = next(n for n in ast.walk(summary_class) if isinstance(n, ast.FunctionDef) and n.name == '__init__')
    parameters = {a.arg for a in init.args.kwonlyargs}
    fields = set(ConversationSummary.model_fields)
    harness_only = set(HARNESS_SUMMARY_FIELDS) - fields
    assert parameters == fields | harness_only, 'a field was added without its constructor parameter'
    # and pydantic's own constructor takes each of them
    for name in harness_only:
        value = 'x' if name == 'id' else 1
        assert getattr(ConversationSummary.model_validate({name: value}), name) == value


# -- saving what the harness saves -----------------------------------------------------------


def _answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart('Lisbon in May is mild.')])


async def test_harness_fields_round_trip_and_tokens_are_counted(conversations: SqliteConversationStore) -> None:
    result = await Agent(FunctionModel(_answer)).run('When should I visit Lisbon?')
    checkout = GitCheckout(repository='/src/trips/.git', name='trips', root='/src/trips', branch='main')
    summary = ConversationSummary(
        id='trip',
        workspace='/src/trips',
        checkout=checkout,
        model='function:_answer',
        run_id='run-1',
        outcome='completed',
        metadata={'customer': 'Ana'},
    )
    saved = await conversations.save(summary=summary, messages=result.all_messages())
    assert saved.total_tokens == result.usage.total_tokens > 0
    assert saved.message_count == 2

    loaded = await conversations.get(conversation_id='trip')
    assert loaded is not None
    got = loaded.summary
    assert (got.id, got.workspace, got.checkout, got.model, got.run_id, got.outcome) == (
        'trip',
        '/src/trips',
        checkout,
        'function:_answer',
        'run-1',
        'completed',
    )
    assert (got.revision, got.total_tokens, got.archived_at, got.owner_pid) == (1, saved.total_tokens, None, None)
    assert loaded.messages == result.all_messages()
    # the workspace is searched, as the harness searches its metadata
    assert [s.id for s in await conversations.listing(query='/SRC/TRIPS')] == ['trip']


async def test_a_content_save_keeps_a_name_committed_meanwhile(conversations: SqliteConversationStore) -> None:
    first = await conversations.save(summary=ConversationSummary(id='c'), messages=turn('plan a trip', 'sure'))
    # a naming worker names the conversation from `first` while the foreground still holds `first`
    named = await conversations.name(source=first, title='Trip plan', tags=['travel'], tokens=12)
    assert named is not None
    saved = await conversations.save(summary=first, messages=turn('plan a trip to Rome', 'sure'))
    assert (saved.title, saved.tags, saved.title_source, saved.naming_tokens) == (
        'Trip plan',
        ['travel'],
        'generated',
        12,
    )
    assert (saved.naming_version, saved.named_revision, saved.revision) == (1, 1, 2)


async def test_naming_tokens_count_even_when_the_name_is_refused(conversations: SqliteConversationStore) -> None:
    first = await conversations.save(summary=ConversationSummary(id='c'), messages=turn('a', 'b'))
    newer = await conversations.save(summary=first, messages=turn('a', 'c'))
    assert await conversations.name(source=first, title='stale', tokens=30) is None
    named = await conversations.name(source=newer, title='fresh', tokens=20)
    assert named is not None
    assert (named.title, named.naming_tokens, named.total_tokens) == ('fresh', 50, newer.total_tokens)
    assert named.updated_at == newer.updated_at, 'naming is not activity'
    with pytest.raises(ValueError, match='tokens=-1'):
        await conversations.name(source=named, title='x', tokens=-1)


async def test_naming_a_deleted_conversation_applies_nothing(conversations: SqliteConversationStore) -> None:
    summary = await conversations.save(summary=ConversationSummary(id='c'), messages=turn('a', 'b'))
    await conversations.delete(source=summary)
    assert await conversations.name(source=summary, title='ghost', tokens=5) is None
    assert await conversations.get(conversation_id='c') is None
    assert await conversations.listing() == []


async def test_search_finds_names_but_not_text_before_a_compaction(conversations: SqliteConversationStore) -> None:
    history: list[ModelMessage] = [
        *turn('tell me about whales', 'they are large'),
        ModelResponse(parts=[CompactionPart(content='summary of the whale talk')]),
        *turn('and dolphins?', 'smaller'),
    ]
    summary = await conversations.save(summary=ConversationSummary(id='sea'), messages=history)

    async def found(query: str) -> list[str]:
        return [s.id for s in await conversations.listing(query=query)]

    assert await found('WHALES') == []
    assert await found('dolphins') == ['sea']
    assert await found('Ocean') == []
    await conversations.name(source=summary, title='Ocean life', subtitle='Cetaceans', tags=['marine'])
    assert await found('ocean') == ['sea']
    assert await found('cetacean') == ['sea']
    assert await found('MARINE') == ['sea']
    assert await found('li') == ['sea'], 'a short query scans the names too'


# -- conversation_text ------------------------------------------------------------------------


def test_conversation_text_renders_user_and_assistant_words_in_order() -> None:
    history: list[ModelMessage] = [
        ModelRequest(
            parts=[
                SystemPromptPart('be brief'),
                UserPromptPart('hello'),
                UserPromptPart(
                    ['see this', BinaryContent(b'\x89PNG', media_type='image/png'), TextContent('and this')]
                ),
            ]
        ),
        ModelResponse(parts=[ThinkingPart('hmm'), TextPart('hi'), ToolCallPart('look', {'q': 1}), TextPart('more')]),
        ModelRequest(parts=[ToolReturnPart('look', 'tool output', tool_call_id='t1')]),
        ModelResponse(parts=[CompactionPart(content='summary')]),
        ModelResponse(parts=[TextPart('after')]),
    ]
    assert conversation_text(history) == (
        'user: hello\nuser: see this\nuser: and this\nassistant: hi\nassistant: more\nassistant: after'
    )
    assert conversation_text([]) == ''


def _with_tool(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart('weather', {'city': 'Oslo'}, tool_call_id='w1')])
    return ModelResponse(parts=[TextPart('Cold and clear.')])


async def test_conversation_text_of_a_runs_latest_snapshot(db_path: Path) -> None:
    store = SqliteStepStore(database=db_path)
    try:
        agent = Agent(FunctionModel(_with_tool), capabilities=[StepPersistence(store=store)])

        @agent.tool_plain
        def weather(city: str) -> str:
            return f'{city}: -3 C'

        await agent.run('Weather in Oslo?', conversation_id='oslo')
        (run,) = await store.list_runs(conversation_id='oslo')
        latest = await store.latest_snapshot(run.run_id)
        assert latest is not None
        assert conversation_text(latest.messages) == 'user: Weather in Oslo?\nassistant: Cold and clear.'
    finally:
        await store.aclose()


# -- ensure_inactive and taking a conversation over ---------------------------------------------

HOLDER = textwrap.dedent(
    """
    import pathlib, sys, time, anyio
    from pydantic_ai.messages import ModelRequest, UserPromptPart
    from step_sqlite import SqliteConversationStore

    db, ready = sys.argv[1], pathlib.Path(sys.argv[2])

    async def main() -> None:
        async with SqliteConversationStore(database=db) as store:
            current = await store.get(conversation_id='held')
            messages = [*current.messages, ModelRequest(parts=[UserPromptPart('working on it')])]
            await store.save(summary=current.summary, messages=messages, in_progress=True)
        ready.write_text('ready')
        while True:
            time.sleep(1)

    anyio.run(main)
    """
)


async def test_a_conversation_held_by_a_live_process_is_not_taken_over_until_it_dies(
    conversations: SqliteConversationStore, db_path: Path, tmp_path: Path
) -> None:
    await conversations.save(summary=ConversationSummary(id='held', workspace='/w'), messages=turn('start', 'ok'))
    ready = tmp_path / 'holder.ready'
    holder = await anyio.open_process([sys.executable, '-c', HOLDER, str(db_path), str(ready)], stdout=None)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.returncode is None, 'the holder process exited early'
            assert time.monotonic() < deadline, 'the holder process did not take the conversation'
            await anyio.sleep(0.01)
        held = await conversations.get(conversation_id='held')
        assert held is not None
        summary = held.summary
        assert (summary.outcome, summary.owner_pid, summary.busy, summary.revision) == ('running', holder.pid, True, 2)

        with pytest.raises(ConversationConflict, match=f'running in process {holder.pid}') as refused:
            ensure_inactive(summary)
        assert isinstance(refused.value, ValueError)
        assert refused.value.conversation_id == 'held'
        with pytest.raises(ConversationConflict, match=f'running in process {holder.pid}'):
            await conversations.save(summary=summary, messages=held.messages, in_progress=True)
        with pytest.raises(ConversationConflict, match=f'running in process {holder.pid}'):
            await conversations.delete(source=summary)
        unchanged = await conversations.get(conversation_id='held')
        assert unchanged is not None
        assert (unchanged.summary.revision, unchanged.summary.owner_pid) == (2, holder.pid)
        assert unchanged.messages == held.messages
    finally:
        holder.send_signal(signal.SIGKILL)
        await holder.wait()  # reaped, so its process id is gone
        await holder.aclose()

    after = await conversations.get(conversation_id='held')
    assert after is not None
    assert (after.summary.owner_pid, after.summary.outcome, after.summary.busy) == (holder.pid, 'running', False)
    ensure_inactive(after.summary)  # the owner is dead: it may be taken over
    taken = await conversations.save(summary=after.summary, messages=after.messages, in_progress=True)
    assert (taken.owner_pid, taken.outcome, taken.busy, taken.revision) == (os.getpid(), 'running', True, 3)
    with pytest.raises(ConversationConflict, match=f'running in process {os.getpid()}'):
        ensure_inactive(taken)  # this process counts like any other
    released = await conversations.save(summary=taken, messages=after.messages, in_progress=False)
    assert (released.owner_pid, released.outcome, released.busy) == (None, 'ready', False)
    ensure_inactive(released)


def test_ensure_inactive_checks_only_running_conversations_with_an_owner() -> None:
    ensure_inactive(ConversationSummary(id='a', outcome='completed', owner_pid=os.getpid()))
    ensure_inactive(ConversationSummary(id='b', outcome='running'))
    with pytest.raises(ConversationConflict, match=f"'c': it is running in process {os.getpid()}"):
        ensure_inactive(ConversationSummary(id='c', outcome='running', owner_pid=os.getpid()))


async def test_summaries_are_copied_with_dataclasses_replace_as_the_harness_ones_are(
    conversations: SqliteConversationStore,
) -> None:
    # Code written for pydantic-ai-harness, whose summaries are dataclasses, copies them with
    # `dataclasses.replace`, passing that library's field names.
    checkout = GitCheckout(repository='/r/.git', name='r', root='/r', branch='main')
    running = ConversationSummary(id='c', workspace='/w', checkout=checkout, outcome='running', owner_pid=os.getpid())
    with pytest.raises(ConversationConflict, match='busy'):
        ensure_inactive(running)
    finished = dataclasses.replace(running, outcome='completed')
    ensure_inactive(finished)
    assert (finished.id, finished.owner_pid) == ('c', os.getpid())
    assert (finished.checkout, finished.workspace) == (checkout, '/w')
    released = dataclasses.replace(running, owner_pid=None)
    assert (released.writer_pid, released.outcome) == (None, 'running')
    ensure_inactive(released)
    renamed = dataclasses.replace(running, id='d', naming_version=3)
    assert (renamed.conversation_id, renamed.name_revision) == ('d', 3)
    moved = dataclasses.replace(checkout, branch='dev')
    assert moved == GitCheckout(repository='/r/.git', name='r', root='/r', branch='dev')
    with pytest.raises(ValueError, match="'finished'"):
        dataclasses.replace(running, outcome='finished')  # the copy is validated like any summary
    assert running.outcome == 'running'

    saved = await conversations.save(summary=finished, messages=turn('a', 'b'))
    read = await conversations.get(conversation_id='c')
    assert read is not None
    again = dataclasses.replace(read, messages=[*read.messages, *turn('c', 'd')])
    assert len(again.messages) == 4
    assert again.summary == saved
    listed = dataclasses.asdict(saved)
    assert (listed['id'], listed['owner_pid'], listed['outcome']) == ('c', os.getpid(), 'completed')
    assert 'writer_pid' not in listed  # each field once, by the harness's name


async def test_conflicts_say_busy_and_another_process_as_the_harness_does(
    conversations: SqliteConversationStore, db_path: Path
) -> None:
    # Callers of pydantic-ai-harness match "another process" (a save that lost the race to another
    # writer) and "busy" (a conversation a live process is running).
    first = await conversations.save(summary=ConversationSummary(id='c', workspace='/w'), messages=turn('a', 'b'))
    async with SqliteConversationStore(database=db_path) as elsewhere:
        await elsewhere.save(summary=first, messages=turn('a', 'c'))
    with pytest.raises(ConversationConflict) as lost:
        await conversations.save(summary=first, messages=turn('a', 'stale'))
    assert isinstance(lost.value, ValueError)
    assert 'another process' in str(lost.value)
    assert 'based on revision 1 but revision 2 is stored' in str(lost.value)

    sleeper = await anyio.open_process([sys.executable, '-c', 'import time; time.sleep(120)'], stdout=None)
    try:
        current = await conversations.get(conversation_id='c')
        assert current is not None
        running = current.summary.model_copy(update={'outcome': 'running', 'writer_pid': sleeper.pid})
        held = await conversations.save(summary=running, messages=current.messages)  # as the harness's app does
        with pytest.raises(ConversationConflict) as busy:
            ensure_inactive(held)
        assert isinstance(busy.value, ValueError)
        assert f'running in process {sleeper.pid} on this machine, so it is busy' in str(busy.value)
        for refused in (
            lambda: conversations.save(summary=held, messages=current.messages, in_progress=True),
            lambda: conversations.delete(source=held),
        ):
            with pytest.raises(ConversationConflict, match=f'running in process {sleeper.pid}') as busy:
                await refused()
            assert 'busy' in str(busy.value)
    finally:
        sleeper.kill()
        await sleeper.wait()
        await sleeper.aclose()


async def test_the_owner_itself_and_harness_style_saves_keep_the_conversation(
    conversations: SqliteConversationStore,
) -> None:
    # the harness way: the application sets outcome and owner_pid on the summary it saves
    running = ConversationSummary(id='c', outcome='running', owner_pid=os.getpid())
    first = await conversations.save(summary=running, messages=turn('a', 'b'))
    again = await conversations.save(summary=first, messages=turn('a', 'c'))
    assert (again.outcome, again.owner_pid, again.busy) == ('running', os.getpid(), True)
    done = await conversations.save(summary=again.model_copy(update={'outcome': 'completed'}), messages=turn('a', 'd'))
    assert (done.outcome, done.owner_pid, done.busy) == ('completed', os.getpid(), False)
    await conversations.delete(source=done)


# -- archiving --------------------------------------------------------------------------------


async def test_archiving_hides_from_the_active_listing_without_touching_content(
    conversations: SqliteConversationStore,
) -> None:
    kept = await conversations.save(summary=ConversationSummary(id='kept'), messages=turn('a', 'b'))
    old = await conversations.save(summary=ConversationSummary(id='old'), messages=turn('c', 'd'))

    archived = await conversations.set_archived(conversation_id='old', archived=True)
    assert archived.archived_at is not None
    assert (archived.revision, archived.updated_at) == (old.revision, old.updated_at)
    again = await conversations.set_archived(conversation_id='old', archived=True)
    assert again.archived_at == archived.archived_at, 'archiving twice keeps the first time'

    assert [s.id for s in await conversations.listing(archived=False)] == ['kept']
    assert [s.id for s in await conversations.listing(archived=True)] == ['old']
    assert {s.id for s in await conversations.listing()} == {'kept', 'old'}
    assert [s.id for s in await conversations.listing(query='d', archived=True)] == ['old']

    back = await conversations.set_archived(conversation_id='old', archived=False)
    assert back.archived_at is None
    await conversations.set_archived(conversation_id='old', archived=True)
    resumed = await conversations.save(summary=back, messages=turn('c', 'e'))
    assert resumed.archived_at is None, 'new content lists it again'
    assert {s.id for s in await conversations.listing(archived=False)} == {'kept', 'old'}
    assert kept.archived_at is None

    with pytest.raises(LookupError, match="no conversation 'nope' to archive"):
        await conversations.set_archived(conversation_id='nope', archived=True)


async def test_listing_returns_200_by_default(conversations: SqliteConversationStore) -> None:
    for i in range(201):
        await conversations.save(summary=ConversationSummary(id=f'c{i:03d}'), messages=turn('q', 'a'))
    assert len(await conversations.listing()) == 200
    assert len(await conversations.listing(offset=200)) == 1


async def test_the_store_names_its_database_and_media(conversations: SqliteConversationStore, db_path: Path) -> None:
    assert conversations.database == db_path
    assert conversations.media is conversations.media_store is not None


# -- a database of the previous layout -----------------------------------------------------------

V1_LAYOUT = """
CREATE TABLE stepcore_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL);
INSERT INTO stepcore_schema VALUES ('conversations', 1);
CREATE TABLE conversations (
    conversation_id TEXT PRIMARY KEY, revision INTEGER NOT NULL, name_revision INTEGER NOT NULL DEFAULT 0,
    named_at_revision INTEGER, meta_version INTEGER NOT NULL, meta TEXT NOT NULL, messages_format INTEGER NOT NULL,
    messages TEXT NOT NULL, message_count INTEGER NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
    writer_pid INTEGER
);
CREATE INDEX conversations_updated ON conversations (updated_at DESC, conversation_id);
CREATE VIRTUAL TABLE conversations_search USING fts5(conversation_id UNINDEXED, body, tokenize = 'trigram');
"""
"""The layout before version 2, as step-sqlite created it: no outcome, no archive mark, names not searched."""


def _build_v1(db: Path, dead_pid: int) -> dict[str, list[ModelMessage]]:
    rows = {
        'named': (turn('Plan the Lisbon trip', 'Sure'), {'title': 'Lisbon', 'tags': ['travel']}, 2, 1, None),
        'in-progress-dead': (turn('draft the report', 'drafting'), {}, 0, None, dead_pid),
        'in-progress-live': (turn('compile the book', 'compiling'), {}, 0, None, os.getpid()),
    }
    raw = sqlite3.connect(db)
    try:
        raw.executescript(V1_LAYOUT)
        for minute, (conversation_id, (messages, name, name_revision, named_at, pid)) in enumerate(rows.items()):
            meta = {
                'title': name.get('title'),
                'subtitle': None,
                'tags': name.get('tags', []),
                'title_source': 'generated' if name else None,
                'metadata': {'customer': 'Ana'},
            }
            body = '[' + ','.join(encode_message(m).decode() for m in messages) + ']'
            when = datetime(2025, 1, 1, 12, minute, tzinfo=UTC).isoformat()
            raw.execute(
                'INSERT INTO conversations VALUES (?, 1, ?, ?, 1, ?, 1, ?, ?, ?, ?, ?)',
                (conversation_id, name_revision, named_at, json.dumps(meta), body, len(messages), when, when, pid),
            )
            words = '\n'.join(part.content for m in messages for part in m.parts if isinstance(part.content, str))
            raw.execute('INSERT INTO conversations_search VALUES (?, ?)', (conversation_id, f'{words}\nAna'.casefold()))
        raw.commit()
    finally:
        raw.close()
    return {conversation_id: messages for conversation_id, (messages, *_) in rows.items()}


async def test_a_database_of_the_previous_layout_is_upgraded_in_place(tmp_path: Path) -> None:
    db = tmp_path / 'old.db'
    finished = await anyio.run_process([sys.executable, '-c', 'import os; print(os.getpid())'])
    dead_pid = int(finished.stdout)
    before = _build_v1(db, dead_pid)

    async with SqliteConversationStore(database=db) as store:
        listed = {s.id: s for s in await store.listing()}
        assert set(listed) == set(before)
        with sqlite3.connect(db) as raw:
            (version,) = raw.execute("SELECT version FROM stepcore_schema WHERE component = 'conversations'").fetchone()
            columns = {r[1] for r in raw.execute('PRAGMA table_info(conversations)')}
        assert version == CONVERSATIONS.version == 2
        assert {'owner_pid', 'outcome', 'archived_at'} <= columns
        assert 'writer_pid' not in columns

        named = listed['named']
        assert (named.title, named.tags, named.naming_version, named.named_revision) == ('Lisbon', ['travel'], 2, 1)
        assert (named.outcome, named.owner_pid, named.workspace, named.archived_at) == ('ready', None, '', None)
        # an older release's in-progress writer is now a running owner, busy exactly while it lives
        dead, live = listed['in-progress-dead'], listed['in-progress-live']
        assert (dead.outcome, dead.owner_pid, dead.busy) == ('running', dead_pid, False)
        assert (live.outcome, live.owner_pid, live.busy) == ('running', os.getpid(), True)
        ensure_inactive(dead)
        with pytest.raises(ConversationConflict):
            ensure_inactive(live)

        for conversation_id, messages in before.items():
            saved = await store.get(conversation_id=conversation_id)
            assert saved is not None
            assert saved.messages == messages
        # the old search text still matches, and names are searched now
        assert [s.id for s in await store.listing(query='REPORT')] == ['in-progress-dead']
        assert [s.id for s in await store.listing(query='lisbon')] == ['named']
        assert [s.id for s in await store.listing(query='travel')] == ['named']
        assert len(await store.listing(query='ana')) == 3

        # and it is written like any other
        taken = await store.save(summary=dead, messages=turn('draft the report', 'done'), in_progress=False)
        assert (taken.revision, taken.outcome, taken.owner_pid) == (2, 'ready', None)
        await store.set_archived(conversation_id='named', archived=True)
        assert [s.id for s in await store.listing(archived=True)] == ['named']

    async with SqliteConversationStore(database=db) as reopened:  # already current: nothing to migrate
        assert len(await reopened.listing()) == 3
