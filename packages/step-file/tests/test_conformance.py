"""FileStepStore against the shared conformance suite, with the damage hook the kit's damage section uses."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_file import FileStepStore
from step_file.logs import json_object
from step_file.nodes import node_id_of, parse_nodes
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent, StepStore, ToolEffectRecord, ToolEffectStatus
from stepcore.engine import DamagedRecordError
from stepcore.engine._seal import Sealer
from stepcore_conformance import (
    ConcurrencyConformance,
    EffectsConformance,
    EventsConformance,
    LeasesConformance,
    PersistenceConformance,
    SnapshotsConformance,
    StepStoreConformance,
)

Damage = Callable[[StepStore, str, str, int | str | None, bytes], Awaitable[None]]


def _replace(path: Path, data: bytes) -> None:
    """Give `path` new content through a new file, as an editor would (the store notices the new inode)."""
    tmp = path.with_name(path.name + '.damage')
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _rewrite(path: Path, lines: list[bytes], changed: int, what: str) -> None:
    if not changed:
        raise AssertionError(f'{what} is not in {path}: nothing to damage')
    _replace(path, b''.join(line + b'\n' for line in lines))


async def damage_file_store(
    store: StepStore, kind: str, run_id: str, ident: int | str | None, replacement: bytes
) -> None:
    """Overwrite the stored body of one record of a `FileStepStore` with `replacement` (see the kit's damage hook)."""
    assert isinstance(store, FileStepStore)
    folder = store.directory / run_id
    if kind == 'run':
        _replace(folder / 'run.json', replacement)
    elif kind in ('event', 'effect'):
        path = folder / ('events.jsonl' if kind == 'event' else 'tool_effects.jsonl')
        lines = path.read_bytes().splitlines()
        field = 'seq' if kind == 'event' else 'tool_call_id'
        matching = [i for i, line in enumerate(lines) if (json_object(line) or {}).get(field) == ident]
        for index in matching[-1:]:  # a tool call's latest line is its entry
            lines[index] = replacement
        _rewrite(path, lines, len(matching), f'{kind} {ident!r}')
    elif kind == 'snapshot':
        path = folder / 'snapshots' / f'{ident}.json'
        document = json.loads(path.read_bytes())
        head = json.dumps(document['head']).encode()
        _replace(path, b'{"format":1,"head":%s,"length":%d,"snapshot":%s}' % (head, document['length'], replacement))
    elif kind == 'message':
        assert isinstance(ident, str)
        path = folder / 'messages.jsonl'
        lines = path.read_bytes().splitlines()
        nodes, _ = parse_nodes(lines, path)
        changed = 0
        for index, line in enumerate(lines):
            node = node_id_of(line)
            if node is not None and ident.encode() in nodes[node][1]:
                parent = nodes[node][0]
                lines[index] = b'{"id":%d,"parent":%s,"body":%s}' % (
                    node,
                    b'null' if parent is None else b'%d' % parent,
                    replacement,
                )
                changed += 1
        _rewrite(path, lines, changed, f'a message holding {ident!r}')
    else:
        raise ValueError(f'unknown record kind {kind!r}')


class TestFileStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(self, tmp_path: Path, store_options: dict[str, Any]) -> AsyncIterator[FileStepStore]:
        store = FileStepStore(tmp_path / 'runs', **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, tmp_path: Path) -> dict[str, Any]:
        return {'backend': 'file', 'directory': str(tmp_path / 'runs')}

    @pytest.fixture
    def other_store_spec(self, tmp_path: Path) -> dict[str, Any]:
        return {'backend': 'file', 'directory': str(tmp_path / 'other')}

    @pytest.fixture
    def damage(self) -> Damage:
        return damage_keeping_keys


async def damage_keeping_keys(
    store: StepStore, kind: str, run_id: str, ident: int | str | None, replacement: bytes
) -> None:
    """The kit's damage hook: a ledger line keeps the `tool_call_id` it is filed under, as a database
    row keeps its key columns, so only the entry's content is damaged."""
    if kind == 'effect':
        replacement = json.dumps({**json.loads(replacement), 'tool_call_id': ident}, separators=(',', ':')).encode()
    await damage_file_store(store, kind, run_id, ident, replacement)


class TestFileStepStoreFullDurability(
    EventsConformance,
    SnapshotsConformance,
    EffectsConformance,
    ConcurrencyConformance,
    PersistenceConformance,
    LeasesConformance,
):
    """The write-path sections again, and leases, with every append and rename fsynced."""

    @pytest.fixture
    async def store(self, tmp_path: Path, store_options: dict[str, Any]) -> AsyncIterator[FileStepStore]:
        store = FileStepStore(tmp_path / 'runs', durability='full', **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, tmp_path: Path) -> dict[str, Any]:
        return {'backend': 'file', 'directory': str(tmp_path / 'runs'), 'durability': 'full'}


# -- the damage hook, against the engine's policy ------------------------------------------------

REPLACEMENT = b'{"format":1,"kind":17,"started_at":"never"}'
"""Valid JSON that is no valid record of any kind (`{"format":1,"kind":17}` alone is a valid
`RunRecord`: a record ignores unknown fields and every other field of a run has a default)."""
MARKER = 'marker-7f3a'


async def _write_run(store: FileStepStore, run_id: str) -> list[ModelMessage]:
    await store.register_run(RunRecord(run_id=run_id, conversation_id='damage'))
    for kind in (EventKind.RUN_STARTED, EventKind.MODEL_REQUEST_STARTED, EventKind.MODEL_REQUEST_COMPLETED):
        await store.append_event(StepEvent(run_id=run_id, kind=kind, step_index=0))
    await store.record_tool_effect(
        ToolEffectRecord(run_id=run_id, tool_call_id='a', tool_name='t', status=ToolEffectStatus.STARTED)
    )
    await store.record_tool_effect(
        ToolEffectRecord(run_id=run_id, tool_call_id='a', tool_name='t', status=ToolEffectStatus.COMPLETED)
    )
    await store.record_tool_effect(
        ToolEffectRecord(run_id=run_id, tool_call_id='b', tool_name='t', status=ToolEffectStatus.STARTED)
    )
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('hello')])]
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=1, messages=messages))
    messages = [*messages, ModelResponse(parts=[TextPart(f'an answer with {MARKER}')])]
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=2, messages=messages))
    return messages


@pytest.fixture
async def damaged_store(tmp_path: Path) -> AsyncIterator[FileStepStore]:
    store = FileStepStore(tmp_path / 'runs')
    await _write_run(store, 'other')
    yield store
    await store.aclose()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == 'stepcore.engine' and r.levelno == logging.WARNING]


@pytest.mark.parametrize('replacement', [REPLACEMENT, b'{"format":1,"kind":17}'])
async def test_damaged_event_is_skipped_with_a_warning(
    damaged_store: FileStepStore, caplog: pytest.LogCaptureFixture, replacement: bytes
) -> None:
    await _write_run(damaged_store, 'r')
    await damage_file_store(damaged_store, 'event', 'r', 2, replacement)
    with caplog.at_level(logging.WARNING):
        assert [e.seq for e in await damaged_store.list_events('r')] == [1, 3]
    (warning,) = _warnings(caplog)
    assert "event seq=2 of run 'r'" in warning
    assert [e.seq for e in await damaged_store.list_events('other')] == [1, 2, 3]


@pytest.mark.parametrize('replacement', [REPLACEMENT, b'{"format":1,"kind":17}'])
async def test_damaged_ledger_entry_fails_every_ledger_read(damaged_store: FileStepStore, replacement: bytes) -> None:
    await _write_run(damaged_store, 'r')
    await damage_file_store(damaged_store, 'effect', 'r', 'a', replacement)
    for read in (
        lambda: damaged_store.list_tool_effects('r'),
        lambda: damaged_store.list_unresolved_tool_effects('r'),
        lambda: damaged_store.get_tool_effect('r', 'b'),
    ):
        with pytest.raises(DamagedRecordError, match=r'line 2 of tool_effects\.jsonl') as caught:
            await read()
        assert caught.value.run_id == 'r'
    assert [e.tool_call_id for e in await damaged_store.list_tool_effects('other')] == ['a', 'b']


async def test_damaged_ledger_line_names_its_tool_call_when_it_can(damaged_store: FileStepStore) -> None:
    await _write_run(damaged_store, 'r')
    await damage_file_store(damaged_store, 'effect', 'r', 'b', b'{"tool_call_id":"b","status":"sent"')
    with pytest.raises(DamagedRecordError, match="tool call 'b' of run 'r'"):
        await damaged_store.list_unresolved_tool_effects('r')


@pytest.mark.parametrize(('kind', 'ident'), [('snapshot', 2), ('message', MARKER)])
@pytest.mark.parametrize('replacement', [REPLACEMENT, b'{"format":1,"kind":17}'])
async def test_damaged_snapshot_is_raised_by_latest_and_skipped_by_list(
    damaged_store: FileStepStore, caplog: pytest.LogCaptureFixture, kind: str, ident: int | str, replacement: bytes
) -> None:
    await _write_run(damaged_store, 'r')
    await damage_file_store(damaged_store, kind, 'r', ident, replacement)
    with pytest.raises(DamagedRecordError, match="snapshot seq=2 of run 'r'") as caught:
        await damaged_store.latest_snapshot('r')
    assert caught.value.run_id == 'r'
    with caplog.at_level(logging.WARNING):
        assert [s.seq for s in await damaged_store.list_snapshots('r', include_interrupted=True)] == [1]
    (warning,) = _warnings(caplog)
    assert 'snapshot seq=2' in warning
    latest = await damaged_store.latest_snapshot('other')
    assert latest is not None
    assert latest.seq == 2


async def test_damaged_run_record_is_skipped_by_list_runs_and_raised_by_get_run(
    damaged_store: FileStepStore, caplog: pytest.LogCaptureFixture
) -> None:
    await _write_run(damaged_store, 'r')
    await damage_file_store(damaged_store, 'run', 'r', None, REPLACEMENT)
    with pytest.raises(DamagedRecordError, match="run record of run 'r'"):
        await damaged_store.get_run('r')
    with caplog.at_level(logging.WARNING):
        assert [r.run_id for r in await damaged_store.list_runs()] == ['other']
    (warning,) = _warnings(caplog)
    assert "run 'r'" in warning
    assert [e.seq for e in await damaged_store.list_events('r')] == [1, 2, 3]  # the rest of the run is readable


# -- the words a damaged record's error uses -------------------------------------------------------
# Bodies of record format 1 carry no checksum, so an altered one reaches validation; each error
# carries pydantic-ai-harness's phrase for the case, which callers match on, and names the field.


async def _damaged_error(read: Callable[[], Awaitable[object]]) -> DamagedRecordError:
    with pytest.raises(DamagedRecordError) as caught:
        await read()
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.run_id == 'r'
    assert error.kind == 'unparsable'
    assert 'checksum' not in str(error)  # the body got as far as validation
    return error


async def test_a_run_record_with_fields_of_the_wrong_types_says_so(
    damaged_store: FileStepStore, caplog: pytest.LogCaptureFixture
) -> None:
    await _write_run(damaged_store, 'r')
    await damage_file_store(damaged_store, 'run', 'r', None, b'{"format":1,"metadata":"tags","agent_name":7}')
    error = await _damaged_error(lambda: damaged_store.get_run('r'))
    assert error.reason.startswith('run record has wrong types: ')
    assert "metadata: Input should be a valid dictionary (found 'tags')" in error.reason
    assert 'agent_name: Input should be a valid string (found 7)' in error.reason
    where = damaged_store.port.describe()
    assert f"run record of run 'r' in {where} is unparsable: run record has wrong types: " in str(error)
    with caplog.at_level(logging.WARNING):
        assert [r.run_id for r in await damaged_store.list_runs()] == ['other']
    (warning,) = _warnings(caplog)
    assert 'run record has wrong types' in warning


async def test_a_ledger_entry_with_fields_of_the_wrong_types_says_so(damaged_store: FileStepStore) -> None:
    await _write_run(damaged_store, 'r')
    await damage_file_store(
        damaged_store, 'effect', 'r', 'b', b'{"format":1,"tool_call_id":"b","tool_name":["t"],"status":"started"}'
    )
    for read in (
        lambda: damaged_store.list_tool_effects('r'),
        lambda: damaged_store.list_unresolved_tool_effects('r'),
        lambda: damaged_store.get_tool_effect('r', 'b'),
    ):
        error = await _damaged_error(read)
        assert (
            error.reason
            == "tool effect record has wrong types: tool_name: Input should be a valid string (found ['t'])"
        )
        assert 'tool effect record has wrong types' in str(error)


@pytest.mark.parametrize(
    ('status', 'said'),
    [
        (b'"sent"', "unknown tool effect status: 'sent' (known: 'started', 'completed' or 'failed')"),
        (b'""', "unknown tool effect status: ''"),
        (b'3', 'tool effect record has wrong types: status: '),  # not text: a type, as the harness says
    ],
)
async def test_a_ledger_entry_with_an_unknown_status_names_it(
    damaged_store: FileStepStore, status: bytes, said: str
) -> None:
    await _write_run(damaged_store, 'r')
    line = b'{"format":1,"tool_call_id":"b","tool_name":"t","status":%s}' % status
    await damage_file_store(damaged_store, 'effect', 'r', 'b', line)
    for read in (
        lambda: damaged_store.list_tool_effects('r'),
        lambda: damaged_store.list_unresolved_tool_effects('r'),
        lambda: damaged_store.get_tool_effect('r', 'a'),
    ):
        error = await _damaged_error(read)
        assert error.reason.startswith(said), error.reason
        assert said in str(error)


async def test_a_snapshot_with_fields_of_the_wrong_types_says_so(
    damaged_store: FileStepStore, caplog: pytest.LogCaptureFixture
) -> None:
    await _write_run(damaged_store, 'r')
    await damage_file_store(damaged_store, 'snapshot', 'r', 2, b'{"format":1,"state":"complete","step_index":"two"}')
    error = await _damaged_error(lambda: damaged_store.latest_snapshot('r'))
    assert error.reason.startswith('snapshot has wrong types: step_index: Input should be a valid integer')
    assert "(found 'two')" in error.reason
    assert "snapshot seq=2 of run 'r'" in str(error)
    for read in (lambda: damaged_store.get_snapshot('r', 2), lambda: damaged_store.get_snapshot_messages('r', 2)):
        assert 'snapshot has wrong types' in str(await _damaged_error(read))
    with caplog.at_level(logging.WARNING):
        assert [s.seq for s in await damaged_store.list_snapshots('r')] == [1]
    (warning,) = _warnings(caplog)
    assert 'snapshot has wrong types' in warning


async def test_a_snapshot_with_an_unknown_state_names_it(damaged_store: FileStepStore) -> None:
    await _write_run(damaged_store, 'r')
    await damage_file_store(damaged_store, 'snapshot', 'r', 2, b'{"format":1,"state":"paused","step_index":2}')
    error = await _damaged_error(lambda: damaged_store.get_snapshot('r', 2))
    assert error.reason == "unknown snapshot state: 'paused' (known: 'complete' or 'interrupted')"


async def test_an_event_with_fields_of_the_wrong_types_says_so(
    damaged_store: FileStepStore, caplog: pytest.LogCaptureFixture
) -> None:
    await _write_run(damaged_store, 'r')
    await damage_file_store(damaged_store, 'event', 'r', 2, b'{"format":1,"seq":2,"kind":"run_paused"}')
    with caplog.at_level(logging.WARNING):
        assert [e.seq for e in await damaged_store.list_events('r')] == [1, 3]
    (warning,) = _warnings(caplog)
    assert "unknown event kind: 'run_paused'" in warning
    assert 'event payload has wrong types: step_index: missing' in warning


async def test_a_resealed_record_of_the_current_format_with_wrong_types_says_so(damaged_store: FileStepStore) -> None:
    # Altered and given a matching checksum (as the store itself would seal it), the record passes
    # its checksum and is refused by validation, in the same words.
    await _write_run(damaged_store, 'r')
    path = damaged_store.directory / 'r' / 'run.json'
    fields = json.loads(path.read_bytes())
    del fields['c'], fields['run_id']
    path.write_bytes(Sealer().record({**fields, 'started_at': 'yesterday'}, ('r',)))
    error = await _damaged_error(lambda: damaged_store.get_run('r'))
    assert error.reason.startswith('run record has wrong types: started_at: Input should be a valid datetime')
