"""Folders written by the file store before it ran on the storage engine read back the same, and
writes to them continue in the same formats.

`data/pre-engine/runs` was written by that release (a run with a restamped message, an
externalized image, retention at 3 snapshots, idempotency keys); `expected.json` is what that
release's own reads returned from it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, TextPart

from step_file import FileStepStore
from stepcore import ContinuableSnapshot, EventKind, StepEvent, ToolEffectRecord, ToolEffectStatus

DATA = Path(__file__).with_name('data') / 'pre-engine'


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / 'runs', tmp_path / 'runs'))


async def reads(store: FileStepStore) -> dict[str, Any]:
    run = await store.get_run('old')
    latest = await store.latest_snapshot('old')
    latest_any = await store.latest_snapshot('old', include_interrupted=True)
    assert run is not None
    assert latest is not None
    assert latest_any is not None
    return {
        'run': run.model_dump(mode='json'),
        'runs': [r.run_id for r in await store.list_runs()],
        'events': [e.model_dump(mode='json') for e in await store.list_events('old')],
        'effects': [e.model_dump(mode='json') for e in await store.list_tool_effects('old')],
        'unresolved': [e.tool_call_id for e in await store.list_unresolved_tool_effects('old')],
        'snapshots': [s.model_dump(mode='json') for s in await store.list_snapshots('old', include_interrupted=True)],
        'latest': latest.model_dump(mode='json'),
        'latest_any': latest_any.model_dump(mode='json'),
    }


def _as_installed_pydantic_ai_reads(expected: Any) -> Any:
    """`expected.json` with each snapshot's messages as the installed pydantic-ai dumps them.

    The file was dumped by one pydantic-ai release; an older supported one has fewer message
    fields (a newer one may have more, with their defaults), so the messages are compared as
    message objects, not as that release's JSON.
    """
    if isinstance(expected, dict):
        found = cast(dict[str, Any], expected)
        return {
            key: ModelMessagesTypeAdapter.dump_python(ModelMessagesTypeAdapter.validate_python(value), mode='json')
            if key == 'messages'
            else _as_installed_pydantic_ai_reads(value)
            for key, value in found.items()
        }
    if isinstance(expected, list):
        return [_as_installed_pydantic_ai_reads(item) for item in cast(list[Any], expected)]
    return expected


async def test_an_earlier_folder_reads_back_as_that_release_read_it(root: Path) -> None:
    store = FileStepStore(root)
    expected = _as_installed_pydantic_ai_reads(json.loads((DATA / 'expected.json').read_text()))
    assert await reads(store) == expected
    await store.aclose()


async def test_writes_to_an_earlier_folder_continue_in_its_formats(root: Path) -> None:
    store = FileStepStore(root, max_snapshots_per_run=3)
    folder = root / 'old'
    await store.append_event(
        StepEvent(run_id='old', kind=EventKind.RUN_STARTED, idempotency_key='e1', step_index=0)
    )  # applied
    await store.append_event(StepEvent(run_id='old', kind=EventKind.RUN_COMPLETED, step_index=0))
    await store.record_tool_effect(
        ToolEffectRecord(run_id='old', tool_call_id='c1', tool_name='t', status=ToolEffectStatus.COMPLETED)
    )
    latest = await store.latest_snapshot('old', include_interrupted=True)
    assert latest is not None
    messages = [*latest.messages, ModelResponse(parts=[TextPart('done')])]
    await store.save_snapshot(
        ContinuableSnapshot(run_id='old', messages=messages, idempotency_key='k0', step_index=0)
    )  # applied
    await store.save_snapshot(
        ContinuableSnapshot(run_id='old', messages=messages, idempotency_key='final', step_index=0)
    )

    event = folder.joinpath('events.jsonl').read_bytes().splitlines()[-1]
    assert event.startswith(b'{"format":2,"seq":3,"c":"')  # new records are sealed with a checksum
    assert b'"kind":"run_completed",' in event
    effect = json.loads(folder.joinpath('tool_effects.jsonl').read_bytes().splitlines()[-1])
    assert (effect['format'], effect['tool_call_id'], effect['status'], 'run_id' in effect) == (
        2,
        'c1',
        'completed',
        False,
    )
    assert json.loads(folder.joinpath('snapshot-keys.jsonl').read_bytes().splitlines()[-1]) == {
        'seq': 7,
        'state': 'complete',
        'key': 'final',
    }
    assert sorted(p.name for p in (folder / 'snapshots').iterdir()) == ['5.json', '6.json', '7.json']
    document = json.loads((folder / 'snapshots' / '7.json').read_bytes())
    assert (document['format'], document['length'], document['snapshot']['seq']) == (2, len(messages), 7)
    node = json.loads(folder.joinpath('messages.jsonl').read_bytes().splitlines()[-1])
    assert document['head'] == node['id']
    assert node['parent'] == node['id'] - 1  # the new message hangs off the earlier folder's newest

    fresh = FileStepStore(root)
    assert [e.seq for e in await fresh.list_events('old')] == [1, 2, 3]
    assert await fresh.list_unresolved_tool_effects('old') == []
    newest = await fresh.latest_snapshot('old')
    assert newest is not None
    assert (newest.seq, newest.messages) == (7, messages)
    await store.aclose()
    await fresh.aclose()
