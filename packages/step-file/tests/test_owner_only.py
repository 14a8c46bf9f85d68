"""Every file and folder the store creates is its owner's only, whatever the process umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_file import FileStepStore
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.media import digest_of_uri, media_uri

IMAGE = b'\x89PNG\r\n\x1a\n' + bytes(range(256)) * 260  # over the 64 KiB media threshold


@pytest.fixture(params=[0o022, 0o000], ids=['umask-022', 'umask-000'])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


async def test_every_file_and_folder_of_a_run_is_owner_only(tmp_path: Path, umask: int) -> None:
    root = tmp_path / 'missing-parent' / 'runs'
    store = FileStepStore(root, max_snapshots_per_run=1)
    await store.register_run(RunRecord(run_id='run'))
    await store.append_event(StepEvent(run_id='run', kind=EventKind.RUN_STARTED, step_index=0))
    await store.record_tool_effect(
        ToolEffectRecord(run_id='run', tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
    )
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(['look', BinaryContent(data=IMAGE, media_type='image/png')])])
    ]
    await store.save_snapshot(ContinuableSnapshot(run_id='run', messages=messages, idempotency_key='k1', step_index=0))
    messages = [*messages, ModelResponse(parts=[TextPart('a picture')])]
    await store.write_batch(
        [StepEvent(run_id='run', kind=EventKind.RUN_COMPLETED, step_index=0)],
        snapshot=ContinuableSnapshot(run_id='run', messages=messages, idempotency_key='k2', step_index=0),
    )
    await store.aclose()

    created = [tmp_path / 'missing-parent', *sorted((tmp_path / 'missing-parent').rglob('*'))]
    names = {str(p.relative_to(root)) for p in created[2:]}
    assert names == {
        'media',
        f'media/{digest_of_uri(media_uri(IMAGE))}.bin',
        'run',
        'run/.lock',
        'run/run.json',
        'run/events.jsonl',
        'run/tool_effects.jsonl',
        'run/messages.jsonl',
        'run/snapshot-keys.jsonl',
        'run/snapshots',
        'run/snapshots/2.json',
    }
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in created}
    expected = {name: 0o700 if (tmp_path / name).is_dir() else 0o600 for name in modes}
    assert modes == expected
