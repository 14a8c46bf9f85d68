"""FileStepStore behaviour beyond the shared suite: layout, validation, crash tolerance, media."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import (
    BinaryImage,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

import stepcore
from media_disk import DiskMediaStore
from step_file import FileStepStore
from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.engine import DamagedRecordError
from stepcore.media import digest_of_uri, media_uri

IMAGE = b'\x89PNG\r\n\x1a\n' + bytes(range(256)) * 260
"""An image over the default 64 KiB media threshold."""


def history(steps: int, *, image: bool = False) -> list[ModelMessage]:
    """A user prompt followed by `steps` tool exchanges."""
    prompt: list[Any] = ['look at this', BinaryImage(data=IMAGE, media_type='image/png')] if image else ['go']
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(prompt)])]
    for n in range(steps):
        messages.append(ModelResponse(parts=[ToolCallPart('fetch', {'n': n}, tool_call_id=f'call-{n}')]))
        messages.append(ModelRequest(parts=[ToolReturnPart('fetch', f'result {n} ' * 40, tool_call_id=f'call-{n}')]))
    return messages


def snap(run_id: str, messages: list[ModelMessage], step: int = 0, **fields: Any) -> ContinuableSnapshot:
    return ContinuableSnapshot(run_id=run_id, step_index=step, messages=messages, **fields)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / 'runs'


@pytest.fixture
async def store(root: Path):
    store = FileStepStore(root)
    yield store
    await store.aclose()


# -- layout ------------------------------------------------------------------------------------


async def test_run_folder_layout(store: FileStepStore, root: Path) -> None:
    await store.register_run(RunRecord(run_id='run-1', conversation_id='conv', agent_name='librarian'))
    await store.append_event(StepEvent(run_id='run-1', kind=EventKind.RUN_STARTED, step_index=0))
    await store.record_tool_effect(
        ToolEffectRecord(run_id='run-1', tool_call_id='call-0', tool_name='fetch', status=ToolEffectStatus.STARTED)
    )
    messages = history(2)
    await store.save_snapshot(snap('run-1', messages[:3], 1, idempotency_key='s1'))
    await store.save_snapshot(snap('run-1', messages, 2, idempotency_key='s2'))

    run_dir = root / 'run-1'
    assert sorted(p.name for p in run_dir.iterdir()) == [
        '.lock',
        'events.jsonl',
        'messages.jsonl',
        'run.json',
        'snapshot-keys.jsonl',
        'snapshots',
        'tool_effects.jsonl',
    ]
    assert json.loads((run_dir / 'run.json').read_text())['agent_name'] == 'librarian'
    assert sorted(p.name for p in (run_dir / 'snapshots').iterdir()) == ['1.json', '2.json']
    assert [e['kind'] for e in lines(run_dir / 'events.jsonl')] == ['run_started']
    assert [e['seq'] for e in lines(run_dir / 'snapshot-keys.jsonl')] == [1, 2]

    # Each message is stored once: the second snapshot only added the two new messages.
    nodes = lines(run_dir / 'messages.jsonl')
    first = nodes[0]['id']  # a new folder's ids start from the clock, so a re-made folder never reuses them
    assert [(n['id'], n['parent']) for n in nodes] == [(first, None)] + [
        (first + i, first + i - 1) for i in range(1, 5)
    ]
    second = json.loads((run_dir / 'snapshots' / '2.json').read_text())
    assert (second['head'], second['length']) == (first + 4, 5)
    assert 'messages' not in second['snapshot']

    latest = await store.latest_snapshot('run-1')
    assert latest is not None
    assert latest.messages == messages
    assert (latest.seq, latest.step_index, latest.run_id) == (2, 2, 'run-1')


async def test_bytes_grow_linearly(store: FileStepStore, root: Path) -> None:
    messages = history(40)
    sizes: list[int] = []
    for step in range(1, 41):
        await store.save_snapshot(snap('long', messages[: 2 * step + 1], step))
        sizes.append(sum(p.stat().st_size for p in (root / 'long').rglob('*') if p.is_file()))
    growth = [b - a for a, b in itertools.pairwise(sizes)]
    # Every step adds two messages and one small snapshot file, whatever the history length.
    assert max(growth) - min(growth) < 64, growth
    assert len(lines(root / 'long' / 'messages.jsonl')) == len(messages)


async def test_a_batch_and_its_snapshot_take_the_runs_lock_once(
    store: FileStepStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import step_file.store

    held: list[str] = []
    real_lock = step_file.store.run_lock

    def counting_lock(path: Path, *, exclusive: bool, prepare: Any = None):
        if exclusive:
            held.append(path.parent.name)
        return real_lock(path, exclusive=exclusive, prepare=prepare)

    monkeypatch.setattr(step_file.store, 'run_lock', counting_lock)
    effect = ToolEffectRecord(run_id='a', tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
    messages = history(1)
    await store.write_batch(
        [
            StepEvent(run_id='a', kind=EventKind.TOOL_CALL_STARTED, tool_call_id='c', step_index=0),
            effect,
            StepEvent(run_id='b', kind=EventKind.RUN_STARTED, step_index=0),
        ],
        snapshot=snap('a', messages),
    )
    # run a's event, ledger entry and snapshot under one hold; run b's event under its own
    assert sorted(held) == ['a', 'b']
    assert [e.kind for e in await store.list_events('a')] == [EventKind.TOOL_CALL_STARTED]
    assert [e.kind for e in await store.list_events('b')] == [EventKind.RUN_STARTED]
    assert await store.get_tool_effect('a', 'c') == effect
    latest = await store.latest_snapshot('a')
    assert latest is not None
    assert latest.messages == messages


async def test_rewritten_history_is_stored_exactly(store: FileStepStore) -> None:
    messages = history(3)
    await store.save_snapshot(snap('rw', messages, 3))
    compacted: list[ModelMessage] = [messages[0], ModelResponse(parts=[TextPart('summary of three steps')])]
    await store.save_snapshot(snap('rw', compacted, 4))
    snapshots = await store.list_snapshots('rw', include_interrupted=True)
    assert [s.messages for s in snapshots] == [messages, compacted]


# -- run ids -------------------------------------------------------------------------------------

UNSAFE_IDS = ['../escape', 'a/b', '', 'x' * 201, 'white space', '..', 'run\x00']


def _calls(store: FileStepStore, run_id: str) -> list[Callable[[], Awaitable[Any]]]:
    return [
        lambda: store.register_run(RunRecord(run_id=run_id)),
        lambda: store.get_run(run_id),
        lambda: store.append_event(StepEvent(run_id=run_id, kind=EventKind.RUN_STARTED, step_index=0)),
        lambda: store.list_events(run_id),
        lambda: store.save_snapshot(snap(run_id, history(1))),
        lambda: store.latest_snapshot(run_id),
        lambda: store.latest_snapshot(run_id, include_interrupted=True),
        lambda: store.list_snapshots(run_id, include_interrupted=True),
        lambda: store.record_tool_effect(
            ToolEffectRecord(run_id=run_id, tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
        ),
        lambda: store.get_tool_effect(run_id, 'c'),
        lambda: store.list_tool_effects(run_id),
        lambda: store.list_unresolved_tool_effects(run_id),
        # a batch naming the bad run id anywhere is refused whole, before a good run is written
        lambda: store.write_batch(
            [
                StepEvent(run_id='good', kind=EventKind.RUN_STARTED, step_index=0),
                StepEvent(run_id=run_id, kind=EventKind.RUN_STARTED, step_index=0),
            ]
        ),
    ]


@pytest.mark.parametrize('run_id', UNSAFE_IDS)
async def test_unsafe_run_ids_are_refused_and_nothing_is_written(
    store: FileStepStore, tmp_path: Path, run_id: str
) -> None:
    for call in _calls(store, run_id):
        with pytest.raises(ValueError, match='is not path-safe'):
            await call()
    assert list(tmp_path.rglob('*')) == [], 'a refused run id must not create anything'


async def test_reads_of_unknown_runs_create_nothing(store: FileStepStore, root: Path) -> None:
    assert await store.get_run('missing') is None
    assert await store.list_events('missing') == []
    assert await store.latest_snapshot('missing') is None
    assert await store.list_snapshots('missing', include_interrupted=True) == []
    assert await store.get_tool_effect('missing', 'c') is None
    assert await store.list_tool_effects('missing') == []
    assert await store.list_runs() == []
    assert not root.exists()


# -- crash tolerance -------------------------------------------------------------------------------


async def test_torn_event_line_is_ignored_then_repaired(
    store: FileStepStore, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await store.append_event(StepEvent(run_id='torn', kind=EventKind.RUN_STARTED, step_index=0))
    path = root / 'torn' / 'events.jsonl'
    with path.open('ab') as f:
        f.write(b'{"kind":"model_request_started","step_ind')  # a write cut short by a crash

    with caplog.at_level(logging.WARNING, logger='step_file'):
        assert [e.kind for e in await FileStepStore(root).list_events('torn')] == [EventKind.RUN_STARTED]
    assert 'incomplete line' in caplog.text

    # The next append, from this instance or a fresh one, cuts the torn tail off first.
    await FileStepStore(root).append_event(StepEvent(run_id='torn', kind=EventKind.RUN_COMPLETED, step_index=0))
    await store.append_event(StepEvent(run_id='torn', kind=EventKind.RUN_FAILED, step_index=0))
    assert path.read_bytes().endswith(b'}\n')
    assert [e['seq'] for e in lines(path)] == [1, 2, 3]
    events = await store.list_events('torn')
    assert [(e.seq, e.kind) for e in events] == [
        (1, EventKind.RUN_STARTED),
        (2, EventKind.RUN_COMPLETED),
        (3, EventKind.RUN_FAILED),
    ]


async def test_torn_tool_effect_line_is_ignored_then_repaired(store: FileStepStore, root: Path) -> None:
    await store.record_tool_effect(
        ToolEffectRecord(run_id='fx', tool_call_id='a', tool_name='t', status=ToolEffectStatus.STARTED)
    )
    path = root / 'fx' / 'tool_effects.jsonl'
    with path.open('ab') as f:
        f.write(b'{"tool_call_id":"a","status":"compl')
    fresh = FileStepStore(root)
    effect = await fresh.get_tool_effect('fx', 'a')
    assert effect is not None
    assert effect.status is ToolEffectStatus.STARTED
    await fresh.record_tool_effect(
        ToolEffectRecord(run_id='fx', tool_call_id='a', tool_name='t', status=ToolEffectStatus.COMPLETED)
    )
    assert len(lines(path)) == 2
    assert await store.list_unresolved_tool_effects('fx') == []
    effect = await store.get_tool_effect('fx', 'a')
    assert effect is not None
    assert effect.status is ToolEffectStatus.COMPLETED


async def test_torn_message_and_key_lines_are_repaired(store: FileStepStore, root: Path) -> None:
    messages = history(2)
    await store.save_snapshot(snap('nodes', messages[:3], 1, idempotency_key='k1'))
    with (root / 'nodes' / 'messages.jsonl').open('ab') as f:
        f.write(b'{"id":3,"parent":2,"body":{"parts":[{"tool')
    with (root / 'nodes' / 'snapshot-keys.jsonl').open('ab') as f:
        f.write(b'{"seq":2,"sta')

    fresh = FileStepStore(root)
    latest = await fresh.latest_snapshot('nodes')
    assert latest is not None
    assert latest.messages == messages[:3]
    await fresh.save_snapshot(snap('nodes', messages, 2, idempotency_key='k2'))
    await fresh.save_snapshot(snap('nodes', messages, 2, idempotency_key='k1'))  # applied before: suppressed
    # The fresh instance has no memory of the stored history, so it writes its five messages anew,
    # numbered after the three complete nodes (the torn fourth line is gone).
    ids = [n['id'] for n in lines(root / 'nodes' / 'messages.jsonl')]
    assert ids == list(range(ids[0], ids[0] + 8))
    assert [k['key'] for k in lines(root / 'nodes' / 'snapshot-keys.jsonl')] == ['k1', 'k2']
    assert [s.messages for s in await store.list_snapshots('nodes', include_interrupted=True)] == [
        messages[:3],
        messages,
    ]


def _bad_json(path: Path) -> None:
    path.write_text('{"format":1,"head":4,"len')


def _not_an_object(path: Path) -> None:
    path.write_text('[1, 2]')


def _bad_head(path: Path) -> None:
    path.write_text('{"format":1,"head":"four","length":5,"snapshot":{}}')


def _a_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize(
    ('damage', 'words'),
    [
        (_bad_json, 'unparsable'),
        (_not_an_object, 'unparsable'),
        (_bad_head, 'unparsable'),
        (_a_directory, 'unreadable'),
    ],
)
async def test_damaged_snapshot_file_is_skipped_by_list_and_raised_by_latest(
    store: FileStepStore, root: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None], words: str
) -> None:
    messages = history(2)
    await store.save_snapshot(snap('bad', messages[:3], 1))
    await store.save_snapshot(snap('bad', messages, 2))
    damage(root / 'bad' / 'snapshots' / '2.json')

    other = 'unreadable' if words == 'unparsable' else 'unparsable'
    for include_interrupted in (False, True):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger='stepcore.engine'):
            listed = await store.list_snapshots('bad', include_interrupted=include_interrupted)
        assert [s.seq for s in listed] == [1]
        [warning] = [r.getMessage() for r in caplog.records if r.name == 'stepcore.engine']
        assert warning.startswith(f'skipping an {words} record: snapshot seq=2 of run ')
        assert '2.json' in warning
        assert other not in warning
    # Its state is unknown: it may be the newest complete one, so neither read passes over it.
    for include_interrupted in (False, True):
        with pytest.raises(DamagedRecordError, match=rf"snapshot seq=2 of run 'bad'.*2\.json.* is {words}") as raised:
            await store.latest_snapshot('bad', include_interrupted=include_interrupted)
        assert raised.value.kind == words
    # Later saves go on around it, and read back.
    await store.save_snapshot(snap('bad', messages, 3))
    assert [s.seq for s in await store.list_snapshots('bad')] == [1, 3]


async def test_an_unreadable_snapshot_that_retention_prunes_does_not_fail_the_save(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStepStore(root, max_snapshots_per_run=1)
    messages = history(3)
    await store.save_snapshot(snap('dir', messages[:3], 1))
    _a_directory(root / 'dir' / 'snapshots' / '1.json')
    with caplog.at_level(logging.WARNING):
        await store.write_batch(
            [StepEvent(run_id='dir', kind=EventKind.TOOL_CALL_COMPLETED, step_index=0)],
            snapshot=snap('dir', messages, 2),
        )
    assert 'cannot be removed' in caplog.text
    assert 'unreadable' in caplog.text
    # The save and the records after it are all written.
    assert [e.kind for e in await store.list_events('dir')] == [EventKind.TOOL_CALL_COMPLETED]
    assert [s.seq for s in await store.list_snapshots('dir')] == [2]
    await store.aclose()


async def test_an_older_damaged_snapshot_does_not_hide_the_newest(store: FileStepStore, root: Path) -> None:
    messages = history(2)
    await store.save_snapshot(snap('older', messages[:3], 1))
    await store.save_snapshot(snap('older', messages, 2))
    (root / 'older' / 'snapshots' / '1.json').write_text('{')
    latest = await store.latest_snapshot('older')
    assert latest is not None
    assert (latest.seq, latest.messages) == (2, messages)


async def test_snapshot_of_a_newer_record_format_is_refused(store: FileStepStore, root: Path) -> None:
    await store.save_snapshot(snap('newer', history(1)))
    path = root / 'newer' / 'snapshots' / '1.json'
    document = json.loads(path.read_text())
    document['format'] = 99
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match='format version 99'):
        await store.latest_snapshot('newer')
    assert await store.list_snapshots('newer', include_interrupted=True) == []


async def test_unknown_media_marker_version(store: FileStepStore, root: Path, caplog: pytest.LogCaptureFixture) -> None:
    await store.save_snapshot(snap('marker', history(1, image=True)))
    nodes = root / 'marker' / 'messages.jsonl'
    text = nodes.read_text()
    assert '"__stepcore_marker_format__":1' in text
    nodes.write_text(text.replace('"__stepcore_marker_format__":1', '"__stepcore_marker_format__":42'))
    # a body altered after it was written fails its checksum before its marker is read
    with pytest.raises(ValueError, match='fails its checksum'):
        await store.latest_snapshot('marker')
    with caplog.at_level(logging.WARNING):
        assert await store.list_snapshots('marker', include_interrupted=True) == []
    assert 'fails its checksum' in caplog.text
    assert "snapshot seq=1 of run 'marker'" in caplog.text


async def test_snapshots_whose_writes_never_landed_are_passed_over(
    store: FileStepStore, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    messages = history(3)
    await store.save_snapshot(snap('lost', messages[:3], 1))
    kept = (root / 'lost' / 'messages.jsonl').read_bytes()
    await store.save_snapshot(snap('lost', messages[:5], 2))
    await store.save_snapshot(snap('lost', messages, 3))
    # After an operating-system crash: the tail of the message log never reached the disk, and
    # neither did the content of the newest snapshot file.
    (root / 'lost' / 'messages.jsonl').write_bytes(kept)
    (root / 'lost' / 'snapshots' / '3.json').write_bytes(b'\x00' * 64)

    with caplog.at_level(logging.WARNING, logger='step_file'):
        latest = await FileStepStore(root).latest_snapshot('lost')
        listed = await FileStepStore(root).list_snapshots('lost', include_interrupted=True)
    assert latest is not None
    assert (latest.seq, latest.messages) == (1, messages[:3])
    assert [s.seq for s in listed] == [1]
    assert '3.json' in caplog.text
    assert 'missing from messages.jsonl' in caplog.text


async def test_seq_is_never_reused_after_a_crash_between_snapshot_and_key(store: FileStepStore, root: Path) -> None:
    await store.save_snapshot(snap('gap', history(1), 1))
    # A save that crashed after writing its snapshot file but before logging its seq:
    orphan = root / 'gap' / 'snapshots' / '2.json'
    orphan.write_bytes((root / 'gap' / 'snapshots' / '1.json').read_bytes())
    fresh = FileStepStore(root)
    messages = history(2)
    await fresh.save_snapshot(snap('gap', messages, 2))
    assert sorted(p.name for p in (root / 'gap' / 'snapshots').iterdir()) == ['1.json', '2.json', '3.json']
    latest = await fresh.latest_snapshot('gap')
    assert latest is not None
    assert (latest.seq, latest.messages) == (3, messages)


# -- retention -------------------------------------------------------------------------------------


async def test_retention_deletes_snapshot_files_only(root: Path) -> None:
    store = FileStepStore(root, max_snapshots_per_run=2)
    messages = history(5, image=True)
    for step in range(1, 6):
        state = SnapshotState.COMPLETE if step == 1 else SnapshotState.INTERRUPTED
        await store.save_snapshot(snap('keep', messages[: 2 * step + 1], step, state=state, idempotency_key=f'k{step}'))
    # Newest two, plus the newest complete (seq 1).
    assert sorted(p.name for p in (root / 'keep' / 'snapshots').iterdir()) == ['1.json', '4.json', '5.json']
    assert len(lines(root / 'keep' / 'messages.jsonl')) == len(messages), 'nodes are never pruned'
    assert [k['key'] for k in lines(root / 'keep' / 'snapshot-keys.jsonl')] == ['k1', 'k2', 'k3', 'k4', 'k5']
    assert len(list((root / 'media').iterdir())) == 1, 'media is never pruned'
    # A pruned snapshot's key still suppresses a replayed save.
    await store.save_snapshot(snap('keep', messages[:5], 2, idempotency_key='k2'))
    assert [s.seq for s in await store.list_snapshots('keep', include_interrupted=True)] == [1, 4, 5]
    latest = await FileStepStore(root).latest_snapshot('keep', include_interrupted=True)
    assert latest is not None
    assert latest.messages == messages


# -- media -----------------------------------------------------------------------------------------


async def test_binary_content_goes_to_the_default_disk_media_store(store: FileStepStore, root: Path) -> None:
    assert isinstance(store.media_store, DiskMediaStore)
    messages = history(1, image=True)
    await store.save_snapshot(snap('img', messages))
    blob = root / 'media' / f'{digest_of_uri(media_uri(IMAGE))}.bin'
    assert blob.read_bytes() == IMAGE
    assert 'media+sha256://' in (root / 'img' / 'messages.jsonl').read_text()
    latest = await FileStepStore(root).latest_snapshot('img')
    assert latest is not None
    assert latest.messages == messages


async def test_binary_content_below_the_threshold_stays_inline(store: FileStepStore, root: Path) -> None:
    thumbnail = b'\x89PNG\r\n\x1a\n' + bytes(range(256)) * 4  # 1 KiB; the threshold is 64 KiB
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(['look at this', BinaryImage(data=thumbnail, media_type='image/png')])])
    ]
    await store.save_snapshot(snap('thumb', messages))
    assert not (root / 'media').exists(), 'a 1 KiB image was written to the media store'
    assert 'media+sha256://' not in (root / 'thumb' / 'messages.jsonl').read_text()
    latest = await FileStepStore(root).latest_snapshot('thumb')
    assert latest is not None
    assert latest.messages == messages


async def test_large_text_is_externalized_above_the_threshold(root: Path) -> None:
    store = FileStepStore(root, media_threshold_bytes=1024)
    big = 'tool output line\n' * 100
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(big)])]
    await store.save_snapshot(snap('text', messages))
    assert big not in (root / 'text' / 'messages.jsonl').read_text()
    assert (root / 'media' / f'{digest_of_uri(media_uri(big.encode()))}.bin').read_text() == big
    latest = await store.latest_snapshot('text')
    assert latest is not None
    assert latest.messages == messages


async def test_media_store_none_keeps_bytes_inline(root: Path) -> None:
    store = FileStepStore(root, media_store=None)
    messages = history(1, image=True)
    await store.save_snapshot(snap('inline', messages))
    assert not (root / 'media').exists()
    assert 'media+sha256://' not in (root / 'inline' / 'messages.jsonl').read_text()
    latest = await FileStepStore(root, media_store=None).latest_snapshot('inline')
    assert latest is not None
    assert latest.messages == messages


async def test_custom_media_store(root: Path, tmp_path: Path) -> None:
    media = DiskMediaStore(tmp_path / 'elsewhere')
    store = FileStepStore(root, media_store=media)
    await store.save_snapshot(snap('custom', history(1, image=True)))
    assert await media.exists(media_uri(IMAGE))
    assert not (root / 'media').exists()


# -- construction -----------------------------------------------------------------------------------


async def test_built_from_spec(root: Path) -> None:
    store = stepcore.from_spec('file', directory=str(root), max_snapshots_per_run=3)
    assert isinstance(store, FileStepStore)
    assert store.max_snapshots_per_run == 3
    assert store.durability == 'normal'
    await store.register_run(RunRecord(run_id='spec'))
    assert (root / 'spec' / 'run.json').is_file()


async def test_capability_from_spec_writes_to_the_folder(root: Path) -> None:
    capability = stepcore.StepPersistence.from_spec(backend='file', directory=str(root))
    assert isinstance(capability.store, FileStepStore)
    assert capability.store.directory == root


def test_invalid_options_are_refused(root: Path) -> None:
    with pytest.raises(ValueError, match='durability'):
        FileStepStore(root, durability='sometimes')  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='max_snapshots_per_run'):
        FileStepStore(root, max_snapshots_per_run=0)
    with pytest.raises(ValueError, match='media_threshold_bytes'):
        FileStepStore(root, media_threshold_bytes=0)
    assert not root.exists()


async def test_list_runs_skips_folders_without_a_run_record(store: FileStepStore, root: Path) -> None:
    await store.register_run(RunRecord(run_id='b-run', conversation_id='c'))
    await store.register_run(RunRecord(run_id='a-run', conversation_id='c', parent_run_id='b-run'))
    await store.append_event(StepEvent(run_id='events-only', kind=EventKind.RUN_STARTED, step_index=0))
    (root / 'stray').mkdir()
    (root / 'stray' / 'run.json').write_text('{not json')
    assert [r.run_id for r in await store.list_runs()] == ['b-run', 'a-run']
    assert [r.run_id for r in await store.list_runs(parent_run_id='b-run', conversation_id='c')] == ['a-run']


async def test_saving_after_the_run_folder_was_deleted(store: FileStepStore, root: Path) -> None:
    messages = history(3)
    await store.save_snapshot(snap('gone', messages[:5], 2))
    shutil.rmtree(root / 'gone')
    await store.save_snapshot(snap('gone', messages, 3))
    latest = await FileStepStore(root).latest_snapshot('gone')
    assert latest is not None
    assert latest.messages == messages
    assert len(lines(root / 'gone' / 'messages.jsonl')) == len(messages)


async def test_full_durability_writes_the_same_layout(root: Path) -> None:
    store = FileStepStore(root, durability='full')
    await store.register_run(RunRecord(run_id='full'))
    await store.append_event(StepEvent(run_id='full', kind=EventKind.RUN_STARTED, step_index=0))
    await store.record_tool_effect(
        ToolEffectRecord(run_id='full', tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
    )
    messages = history(2)
    await store.save_snapshot(snap('full', messages, 2, idempotency_key='k'))
    reader = FileStepStore(root)
    latest = await reader.latest_snapshot('full')
    assert latest is not None
    assert latest.messages == messages
    assert [e.kind for e in await reader.list_events('full')] == [EventKind.RUN_STARTED]
    assert [r.tool_call_id for r in await reader.list_unresolved_tool_effects('full')] == ['c']
