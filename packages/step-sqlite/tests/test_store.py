"""SqliteStepStore behaviour specific to SQLite: files, connections, incremental storage, media."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import stat
import threading
from pathlib import Path

import pytest
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

import stepcore
from step_sqlite import SqliteMediaStore, SqliteStepStore
from step_sqlite.records import unpack_body
from stepcore import (
    ContinuableSnapshot,
    DamagedRecordError,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.engine._seal import Sealer
from stepcore.store.codec import encode_message, record_fields


def _step(i: int, size: int = 2048) -> list[ModelMessage]:
    return [
        ModelResponse(parts=[ToolCallPart('lookup', {'i': i}, tool_call_id=f'call-{i}')]),
        ModelRequest(parts=[ToolReturnPart('lookup', 'x' * size, tool_call_id=f'call-{i}')]),
    ]


def _prompt_image(snapshot: ContinuableSnapshot | None) -> bytes:
    """The bytes of the `BinaryContent` in a snapshot's first prompt (`['look', BinaryContent(...)]`)."""
    assert snapshot is not None
    request = snapshot.messages[0]
    assert isinstance(request, ModelRequest)
    prompt = request.parts[0]
    assert isinstance(prompt, UserPromptPart)
    assert not isinstance(prompt.content, str)
    blob = prompt.content[1]
    assert isinstance(blob, BinaryContent)
    return blob.data


def _count(db: Path, sql: str) -> int:
    with sqlite3.connect(db) as raw:
        return int(raw.execute(sql).fetchone()[0])


async def test_from_spec_builds_the_sqlite_store_through_the_entry_point(tmp_path: Path) -> None:
    store = stepcore.from_spec('sqlite', database=str(tmp_path / 'runs.db'), max_snapshots_per_run=3)
    try:
        assert isinstance(store, SqliteStepStore)
        assert store.max_snapshots_per_run == 3
        await store.register_run(RunRecord(run_id='r'))
        assert (tmp_path / 'runs.db').exists()
    finally:
        await store.aclose()
    media = stepcore.media_from_spec('sqlite', database=str(tmp_path / 'media.db'))
    assert isinstance(media, SqliteMediaStore)
    await media.aclose()


async def test_data_outlives_the_store_and_reads_back_in_a_new_one(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hello')]), *_step(0)]
    store = SqliteStepStore(database=db)
    await store.register_run(RunRecord(run_id='r', conversation_id='c', metadata={'k': 'v'}))
    await store.append_event(StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0))
    await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=messages))
    await store.record_tool_effect(
        ToolEffectRecord(run_id='r', tool_call_id='call-0', tool_name='lookup', status=ToolEffectStatus.STARTED)
    )
    await store.aclose()

    again = SqliteStepStore(database=db)
    try:
        run = await again.get_run('r')
        assert run is not None
        assert (run.conversation_id, run.metadata) == ('c', {'k': 'v'})
        assert [e.kind for e in await again.list_events('r')] == [EventKind.RUN_STARTED]
        latest = await again.latest_snapshot('r')
        assert latest is not None
        assert latest.step_index == 1
        assert latest.messages == messages
        assert [r.tool_call_id for r in await again.list_unresolved_tool_effects('r')] == ['call-0']
    finally:
        await again.aclose()


async def test_each_message_is_written_once_so_storage_grows_linearly(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db)
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    try:
        for i in range(60):
            messages.extend(_step(i))
            await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=i, messages=list(messages)))
        with sqlite3.connect(db) as raw:
            bodies = [unpack_body(r[0]) for r in raw.execute('SELECT body FROM message_nodes ORDER BY node_id')]
            stored_bytes = int(raw.execute('SELECT SUM(LENGTH(body)) FROM message_nodes').fetchone()[0])
        # each message once, in order (with its checksum, see stepcore.engine._seal)
        assert Sealer().open_nodes('r', bodies, None, sealed=False) == [encode_message(m) for m in messages]
        assert stored_bytes < sum(len(b) for b in bodies)  # the 2 KB tool returns are compressed
        assert _count(db, 'SELECT COUNT(*) FROM snapshots') == 60
        snapshots = await store.list_snapshots('r', include_interrupted=True)
        assert [len(s.messages) for s in snapshots] == [1 + 2 * (i + 1) for i in range(60)]
        assert snapshots[-1].messages == messages
    finally:
        await store.aclose()


async def test_a_history_rewrite_is_stored_without_changing_earlier_snapshots(tmp_path: Path) -> None:
    store = SqliteStepStore(database=tmp_path / 'runs.db')
    try:
        first: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('q')]), *_step(0), *_step(1)]
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=first, step_index=0))
        compacted: list[ModelMessage] = [first[0], ModelResponse(parts=[TextPart('summary of the two lookups')])]
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=compacted, step_index=0))
        grown = [*compacted, *_step(2)]
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=grown, step_index=0))
        assert [s.messages for s in await store.list_snapshots('r', include_interrupted=True)] == [
            first,
            compacted,
            grown,
        ]
    finally:
        await store.aclose()


async def test_a_saved_snapshot_is_isolated_from_later_mutation(tmp_path: Path) -> None:
    store = SqliteStepStore(database=tmp_path / 'runs.db')
    try:
        part = UserPromptPart('original')
        messages: list[ModelMessage] = [ModelRequest(parts=[part])]
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=messages, step_index=0))
        part.content = 'mutated'
        messages.append(ModelResponse(parts=[TextPart('later')]))
        latest = await store.latest_snapshot('r')
        assert latest is not None
        assert len(latest.messages) == 1
        restored = latest.messages[0]
        assert isinstance(restored, ModelRequest)
        assert isinstance(restored.parts[0], UserPromptPart)
        assert restored.parts[0].content == 'original'
    finally:
        await store.aclose()


async def test_pruning_deletes_snapshot_rows_but_keeps_every_message_node(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db, max_snapshots_per_run=2)
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    try:
        for i in range(5):
            messages.extend(_step(i, size=10))
            state = SnapshotState.COMPLETE if i == 1 else SnapshotState.INTERRUPTED
            await store.save_snapshot(
                ContinuableSnapshot(run_id='r', step_index=i, messages=list(messages), state=state)
            )
        kept = await store.list_snapshots('r', include_interrupted=True)
        # newest two, plus the newest complete one (step 1)
        assert [s.step_index for s in kept] == [1, 3, 4]
        assert [s.state for s in kept] == [SnapshotState.COMPLETE, SnapshotState.INTERRUPTED, SnapshotState.INTERRUPTED]
        assert _count(db, 'SELECT COUNT(*) FROM message_nodes') == len(messages)
        complete = await store.latest_snapshot('r')
        assert complete is not None
        assert complete.step_index == 1
        assert len(complete.messages) == 5
    finally:
        await store.aclose()


async def test_snapshot_seq_is_monotonic_per_run_across_interleaved_runs(tmp_path: Path) -> None:
    store = SqliteStepStore(database=tmp_path / 'runs.db')
    try:
        for i in range(3):
            for run in ('a', 'b'):
                await store.save_snapshot(ContinuableSnapshot(run_id=run, step_index=i, messages=[]))
        for run in ('a', 'b'):
            seqs = [s.seq for s in await store.list_snapshots(run, include_interrupted=True)]
            assert [s.step_index for s in await store.list_snapshots(run, include_interrupted=True)] == [0, 1, 2]
            assert all(isinstance(s, int) for s in seqs)
            assert seqs == sorted(seqs)
            assert len(set(seqs)) == 3
    finally:
        await store.aclose()


async def test_concurrent_appends_to_one_run_get_contiguous_seqs(tmp_path: Path) -> None:
    store = SqliteStepStore(database=tmp_path / 'runs.db')
    try:
        await asyncio.gather(
            *(
                store.append_event(StepEvent(run_id='r', kind=EventKind.TOOL_CALL_STARTED, step_index=i))
                for i in range(25)
            )
        )
        events = await store.list_events('r')
        assert [e.seq for e in events] == list(range(1, 26))
        assert sorted(e.step_index for e in events) == list(range(25))
    finally:
        await store.aclose()


async def test_tool_effects_upsert_keeps_one_row_with_the_latest_state(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db)
    try:
        started = ToolEffectRecord(
            run_id='r', tool_call_id='t1', tool_name='pay', args={'amount': 3}, status=ToolEffectStatus.STARTED
        )
        await store.record_tool_effect(started)
        await store.record_tool_effect(
            ToolEffectRecord(run_id='r', tool_call_id='t2', tool_name='pay', status=ToolEffectStatus.STARTED)
        )
        done = started.model_copy(update={'status': ToolEffectStatus.COMPLETED, 'effect_summary': 'paid 3'})
        await store.record_tool_effect(done)
        assert _count(db, "SELECT COUNT(*) FROM tool_effects WHERE tool_call_id = 't1'") == 1
        got = await store.get_tool_effect('r', 't1')
        assert got is not None
        assert (got.status, got.effect_summary, got.args) == (ToolEffectStatus.COMPLETED, 'paid 3', {'amount': 3})
        assert [r.tool_call_id for r in await store.list_tool_effects('r')] == ['t1', 't2']
        assert [r.tool_call_id for r in await store.list_unresolved_tool_effects('r')] == ['t2']
    finally:
        await store.aclose()


# -- media ---------------------------------------------------------------------------------


async def test_binary_content_goes_to_the_media_table_of_the_same_database(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    image = bytes(range(256)) * 260  # over the 64 KiB threshold
    store = SqliteStepStore(database=db)
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(['look', BinaryContent(image, media_type='image/png')])])
    ]
    try:
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=messages, step_index=0))
        await store.save_snapshot(ContinuableSnapshot(run_id='other', messages=messages, step_index=0))
        with sqlite3.connect(db) as raw:
            rows = raw.execute('SELECT data, media_type FROM media').fetchall()
            bodies = [unpack_body(r[0]) for r in raw.execute('SELECT body FROM message_nodes')]
        assert rows == [(image, 'image/png')]  # stored once for both runs
        assert all(b'media+sha256://' in body for body in bodies)
        assert _prompt_image(await store.latest_snapshot('other')) == image
    finally:
        await store.aclose()


async def test_large_text_is_externalized_at_the_threshold(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    big = 'é' * 600  # 1200 UTF-8 bytes
    store = SqliteStepStore(database=db, media_threshold_bytes=1000)
    messages: list[ModelMessage] = [ModelRequest(parts=[ToolReturnPart('t', big, tool_call_id='c')])]
    try:
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=messages, step_index=0))
        assert _count(db, 'SELECT COUNT(*) FROM media') == 1
        assert _count(db, 'SELECT MAX(LENGTH(body)) FROM message_nodes') < 1000
        latest = await store.latest_snapshot('r')
        assert latest is not None
        assert latest.messages == messages
    finally:
        await store.aclose()


async def test_media_store_none_keeps_payloads_inline(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    image = b'\x89PNG' + bytes(70_000)
    store = SqliteStepStore(database=db, media_store=None)
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(['look', BinaryContent(image, media_type='image/png')])])
    ]
    try:
        assert store.media_store is None
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=messages, step_index=0))
        with sqlite3.connect(db) as raw:
            tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            body = unpack_body(raw.execute('SELECT body FROM message_nodes').fetchone()[0])
        assert 'media' not in tables
        assert b'media+sha256://' not in body
        assert len(body) > len(image)
        assert _prompt_image(await store.latest_snapshot('r')) == image
    finally:
        await store.aclose()


async def test_an_explicit_media_store_receives_the_blobs(tmp_path: Path) -> None:
    media = SqliteMediaStore(database=tmp_path / 'media.db')
    store = SqliteStepStore(database=tmp_path / 'runs.db', media_store=media)
    try:
        msg = ModelRequest(parts=[UserPromptPart([BinaryContent(b'abc' * 30_000, media_type='audio/wav')])])
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=[msg], step_index=0))
        assert _count(tmp_path / 'media.db', 'SELECT COUNT(*) FROM media') == 1
        with sqlite3.connect(tmp_path / 'runs.db') as raw:
            tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert 'media' not in tables
    finally:
        await store.aclose()
        await media.aclose()


async def test_unknown_marker_version_fails_latest_and_is_skipped_by_list(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db)
    first: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('plain')])]
    second: list[ModelMessage] = [
        *first,
        ModelRequest(parts=[UserPromptPart([BinaryContent(b'img' * 30_000, media_type='image/png')])]),
    ]
    try:
        await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=0, messages=first))
        await store.save_snapshot(ContinuableSnapshot(run_id='r', step_index=1, messages=second))
        with sqlite3.connect(db) as raw:
            for node_id, body in raw.execute('SELECT node_id, body FROM message_nodes').fetchall():
                newer = unpack_body(body).replace(b'"__stepcore_marker_format__":1', b'"__stepcore_marker_format__":99')
                raw.execute('UPDATE message_nodes SET body = ? WHERE node_id = ?', (newer, node_id))
        # a body altered after it was written fails its checksum before its marker is read
        with pytest.raises(ValueError, match=r'message 1 \(node 2\) is damaged: fails its checksum'):
            await store.latest_snapshot('r')
        with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
            listed = await store.list_snapshots('r', include_interrupted=True)
        assert [s.step_index for s in listed] == [0]
        assert "skipping an unparsable record: snapshot seq=2 of run 'r'" in caplog.text
        assert 'fails its checksum' in caplog.text
    finally:
        await store.aclose()


async def test_a_ledger_status_changed_in_the_database_is_caught_by_the_unresolved_listing(tmp_path: Path) -> None:
    # Settled entries are checked by hashing their bytes, not decoded; the status column is part of
    # what the checksum covers, so a `started` entry marked settled behind the store's back is not
    # silently left out of the unresolved ones.
    db = tmp_path / 'runs.db'
    store = SqliteStepStore(database=db)
    try:
        await store.register_run(RunRecord(run_id='r'))
        await store.record_tool_effect(
            ToolEffectRecord(run_id='r', tool_call_id='done', tool_name='t', status=ToolEffectStatus.STARTED)
        )
        await store.record_tool_effect(
            ToolEffectRecord(run_id='r', tool_call_id='done', tool_name='t', status=ToolEffectStatus.COMPLETED)
        )
        await store.record_tool_effect(
            ToolEffectRecord(run_id='r', tool_call_id='open', tool_name='t', status=ToolEffectStatus.STARTED)
        )
        assert [e.tool_call_id for e in await store.list_unresolved_tool_effects('r')] == ['open']
        with sqlite3.connect(db) as raw:
            raw.execute("UPDATE tool_effects SET status = 'completed' WHERE tool_call_id = 'open'")
        with pytest.raises(DamagedRecordError, match=r"ledger entry of tool call 'open'.*checksum"):
            await store.list_unresolved_tool_effects('r')
    finally:
        await store.aclose()


async def _one_started_entry(db: Path) -> tuple[SqliteStepStore, dict[str, object]]:
    """A store on `db` holding run 'r' with one ledger entry ('c', started), and that entry's stored fields."""
    store = SqliteStepStore(database=db)
    await store.register_run(RunRecord(run_id='r'))
    entry = ToolEffectRecord(run_id='r', tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
    await store.record_tool_effect(entry)
    return store, record_fields(entry, exclude=frozenset({'run_id'}))


@pytest.mark.parametrize('sealed', [False, True], ids=['format-1', 'resealed'])
async def test_a_ledger_entry_with_an_unknown_status_names_it(tmp_path: Path, sealed: bool) -> None:
    # A status column and body set to a value the ledger does not know: in a body of record format 1
    # (no checksum) or one sealed again to match, the entry reaches validation and is refused in the
    # words pydantic-ai-harness uses.
    db = tmp_path / 'runs.db'
    store, fields = await _one_started_entry(db)
    try:
        fields['status'] = 'sent'
        sent = Sealer().record(fields, ('r', 'c', 'sent')).decode() if sealed else json.dumps({**fields, 'format': 1})
        with sqlite3.connect(db) as raw:
            raw.execute("UPDATE tool_effects SET status = 'sent', record = ? WHERE tool_call_id = 'c'", (sent,))
        for read in (lambda: store.list_tool_effects('r'), lambda: store.get_tool_effect('r', 'c')):
            with pytest.raises(DamagedRecordError) as caught:
                await read()
            assert isinstance(caught.value, ValueError)
            assert "unknown tool effect status: 'sent'" in str(caught.value)
            assert caught.value.reason.startswith("unknown tool effect status: 'sent'")
    finally:
        await store.aclose()


async def test_a_ledger_entry_with_fields_of_the_wrong_types_says_so(tmp_path: Path) -> None:
    db = tmp_path / 'runs.db'
    store, fields = await _one_started_entry(db)
    try:
        body = json.dumps({**fields, 'format': 1, 'tool_name': {'name': 't'}})
        with sqlite3.connect(db) as raw:
            raw.execute("UPDATE tool_effects SET record = ? WHERE tool_call_id = 'c'", (body,))
        with pytest.raises(DamagedRecordError, match='tool effect record has wrong types: tool_name: '):
            await store.list_unresolved_tool_effects('r')
    finally:
        await store.aclose()


# -- files, connections, threads -----------------------------------------------------------


async def test_database_files_are_owner_only_and_in_wal_mode(tmp_path: Path) -> None:
    db = tmp_path / 'nested' / 'runs.db'
    store = SqliteStepStore(database=db)
    try:
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(ContinuableSnapshot(run_id='r', messages=_step(0), step_index=0))
        files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in db.parent.iterdir()}
        assert {'runs.db', 'runs.db-wal', 'runs.db-shm'} <= set(files)
        assert all(mode == 0o600 for mode in files.values()), files
        with sqlite3.connect(db) as raw:
            assert raw.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
    finally:
        await store.aclose()


async def test_a_shared_connection_must_allow_other_threads(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / 'app.db')
    try:
        with pytest.raises(ValueError, match='check_same_thread=False'):
            SqliteStepStore(connection=connection)
        with pytest.raises(ValueError, match='check_same_thread=False'):
            SqliteMediaStore(connection=connection)
    finally:
        connection.close()


async def test_exactly_one_of_database_or_connection(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='exactly one of database='):
        SqliteStepStore()
    connection = sqlite3.connect(tmp_path / 'app.db', check_same_thread=False)
    try:
        with pytest.raises(ValueError, match='exactly one of database='):
            SqliteStepStore(database=tmp_path / 'x.db', connection=connection)
    finally:
        connection.close()


async def test_a_shared_connection_is_used_off_the_loop_and_left_open(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / 'app.db', check_same_thread=False)
    threads: set[int] = set()
    connection.set_trace_callback(lambda _sql: threads.add(threading.get_ident()))
    try:
        store = SqliteStepStore(connection=connection)
        await store.register_run(RunRecord(run_id='r'))
        await store.save_snapshot(
            ContinuableSnapshot(
                run_id='r',
                messages=[ModelRequest(parts=[UserPromptPart([BinaryContent(b'z' * 70_000, media_type='image/png')])])],
                step_index=0,
            )
        )
        assert threads
        assert threading.get_ident() not in threads
        await store.aclose()
        with pytest.raises(RuntimeError, match='is closed'):
            await store.get_run('r')
        # the application's connection still works and sees the store's data
        connection.set_trace_callback(None)
        assert connection.execute('SELECT COUNT(*) FROM runs').fetchone()[0] == 1
        assert connection.execute('SELECT COUNT(*) FROM media').fetchone()[0] == 1
    finally:
        connection.close()


@pytest.mark.parametrize('written', [False, True], ids=['empty-database', 'stepcore-database'])
async def test_a_read_only_shared_connection_reports_the_drivers_readonly_database(
    tmp_path: Path, written: bool
) -> None:
    # SQLite's own words ("attempt to write a readonly database") reach the caller, with a note
    # saying which store was doing what: on an empty database the tables cannot even be created.
    db = tmp_path / 'app.db'
    if written:
        owner = SqliteStepStore(database=db)
        await owner.register_run(RunRecord(run_id='old'))
        await owner.aclose()
    else:
        sqlite3.connect(db).close()
    connection = sqlite3.connect(f'file:{db}?mode=ro', uri=True, check_same_thread=False)
    store = SqliteStepStore(connection=connection)
    image = [ModelRequest(parts=[UserPromptPart(['look', BinaryContent(b'z' * 70_000, media_type='image/png')])])]
    writes = {
        'register_run': lambda: store.register_run(RunRecord(run_id='r')),
        'append_event': lambda: store.append_event(StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0)),
        'record_tool_effect': lambda: store.record_tool_effect(
            ToolEffectRecord(run_id='r', tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
        ),
        'save_snapshot': lambda: store.save_snapshot(ContinuableSnapshot(run_id='r', messages=_step(0), step_index=0)),
        'save_snapshot with media': lambda: store.save_snapshot(
            ContinuableSnapshot(run_id='r', messages=image, step_index=1)
        ),
        'delete_run': lambda: store.delete_run('old'),
    }
    try:
        for write, call in writes.items():
            with pytest.raises(sqlite3.OperationalError, match='attempt to write a readonly database') as caught:
                await call()
            (note,) = caught.value.__notes__
            if write == 'save_snapshot with media' and written:
                assert note.startswith('SqliteMediaStore on the shared connection, storing media blob media+sha256://')
            elif write == 'delete_run':
                assert note == "SqliteStepStore on the shared connection, writing run 'old'", write
            else:
                assert note == "SqliteStepStore on the shared connection, writing run 'r'", write
        if written:
            assert await store.get_run('old') is not None  # reading needs no write
        else:
            with pytest.raises(sqlite3.OperationalError, match='readonly database') as caught:
                await store.get_run('old')
            assert caught.value.__notes__ == ["SqliteStepStore on the shared connection, reading run 'old'"]
    finally:
        await store.aclose()
        connection.close()


async def test_aclose_closes_an_owned_connection(tmp_path: Path) -> None:
    store = SqliteStepStore(database=tmp_path / 'runs.db')
    await store.register_run(RunRecord(run_id='r'))
    await store.aclose()
    await store.aclose()  # idempotent
    with pytest.raises(RuntimeError, match='is closed'):
        await store.list_runs()
    media = store.media_store
    assert isinstance(media, SqliteMediaStore)
    with pytest.raises(RuntimeError, match='is closed'):
        await media.exists('media+sha256://' + '0' * 64)


# -- opening while another process holds the lock ----------------------------------------------


def test_wal_switch_is_retried_while_the_database_is_locked() -> None:
    """Confirming WAL mode can report "database is locked" without waiting on the busy timeout."""
    from step_sqlite.connection import _while_locked  # pyright: ignore[reportPrivateUsage]

    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise sqlite3.OperationalError('database is locked')
        return 'wal'

    assert _while_locked(flaky, timeout=5) == 'wal'
    assert len(attempts) == 3

    def broken() -> str:
        raise sqlite3.OperationalError('no such table: t')

    with pytest.raises(sqlite3.OperationalError, match='no such table'):
        _while_locked(broken, timeout=5)

    def always_locked() -> str:
        raise sqlite3.OperationalError('database is locked')

    with pytest.raises(sqlite3.OperationalError, match='locked'):
        _while_locked(always_locked, timeout=0.05)


# -- checkpoints between calls ------------------------------------------------------------------


async def test_the_wal_is_checkpointed_between_calls_every_few_writes(tmp_path: Path) -> None:
    """Pages reach the database file through a checkpoint queued behind every Nth write call."""
    from step_sqlite.connection import CHECKPOINT_EVERY_WRITES

    path = tmp_path / 'runs.db'
    store = SqliteStepStore(database=path, media_store=None)
    await store.register_run(RunRecord(run_id='r'))  # write 1
    event = StepEvent(run_id='r', kind=EventKind.RUN_STARTED, metadata={'pad': 'x' * 1500}, step_index=0)
    for i in range(CHECKPOINT_EVERY_WRITES - 2):
        await store.append_event(event.model_copy(update={'idempotency_key': f'k{i}'}))
    await store.list_runs()
    size_before = path.stat().st_size  # everything so far sits in the WAL
    await store.append_event(event.model_copy(update={'idempotency_key': 'last'}))  # write N
    await store.list_runs()  # queued behind the checkpoint: it has run
    assert path.stat().st_size > size_before
    assert len(await store.list_events('r')) == CHECKPOINT_EVERY_WRITES - 1
    # a read does not count, and closing with a checkpoint queued loses nothing
    for i in range(CHECKPOINT_EVERY_WRITES):
        await store.append_event(event.model_copy(update={'idempotency_key': f'again{i}'}))
    await store.aclose()
    reopened = SqliteStepStore(database=path)
    assert len(await reopened.list_events('r')) == 2 * CHECKPOINT_EVERY_WRITES - 1
    await reopened.aclose()


async def test_stores_built_on_another_stores_database_share_its_connection(tmp_path: Path) -> None:
    from step_sqlite.connection import Database

    db = Database.open(tmp_path / 'shared.db', None, owner='test')
    owner = SqliteStepStore(db)
    await owner.register_run(RunRecord(run_id='r'))
    steps = SqliteStepStore.on_database(db)
    media = SqliteMediaStore(db)
    assert isinstance(steps.media_store, SqliteMediaStore)
    uri = await media.put(b'blob')
    assert [r.run_id for r in await steps.list_runs()] == ['r']
    await steps.aclose()
    await media.aclose()
    # the sharers never close the connection they were given
    assert await owner.get_run('r') is not None
    assert await SqliteMediaStore.on_database(db).get(uri) == b'blob'
    await owner.aclose()
    await db.aclose()
    other = sqlite3.connect(':memory:', check_same_thread=False)
    with pytest.raises(ValueError, match='SqliteStepStore takes a Database or connection=, not both'):
        SqliteStepStore(db, connection=other)
    other.close()
