"""delete_run: a run's folder goes, whole, under its lock; the run can then be written afresh."""

from __future__ import annotations

from pathlib import Path

from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_file import FileStepStore
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus


def history(steps: int) -> list[ModelMessage]:
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
    for n in range(steps):
        messages.append(ModelResponse(parts=[TextPart(f'answer {n}')]))
        messages.append(ModelRequest(parts=[UserPromptPart(f'more {n}')]))
    return messages


async def write_run(store: FileStepStore, run_id: str, messages: list[ModelMessage]) -> None:
    await store.register_run(RunRecord(run_id=run_id))
    await store.append_event(
        StepEvent(run_id=run_id, kind=EventKind.RUN_STARTED, idempotency_key='start', step_index=0)
    )
    await store.record_tool_effect(
        ToolEffectRecord(run_id=run_id, tool_call_id='c', tool_name='t', status=ToolEffectStatus.STARTED)
    )
    await store.save_snapshot(ContinuableSnapshot(run_id=run_id, messages=messages, idempotency_key='k', step_index=0))


async def test_delete_run_removes_the_folder_and_says_whether_it_existed(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await write_run(store, 'gone', history(2))
    kept_messages = history(1)
    await write_run(store, 'kept', kept_messages)

    assert await store.delete_run('gone') is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ['kept'], 'no folder or tombstone is left behind'
    assert await store.get_run('gone') is None
    assert await store.list_events('gone') == []
    assert await store.list_tool_effects('gone') == []
    assert await store.latest_snapshot('gone') is None
    assert [r.run_id for r in await store.list_runs()] == ['kept']

    assert await store.delete_run('gone') is False
    assert await store.delete_run('never-written') is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ['kept'], 'deleting a missing run creates nothing'

    # The run is new again: seqs restart, its keys and history are forgotten.
    messages = history(1)
    await write_run(store, 'gone', messages)
    assert [(e.seq, e.idempotency_key) for e in await store.list_events('gone')] == [(1, 'start')]
    latest = await store.latest_snapshot('gone')
    assert latest is not None
    assert (latest.seq, latest.messages) == (1, messages)
    kept = await store.latest_snapshot('kept')
    assert kept is not None
    assert kept.messages == kept_messages
    await store.aclose()


async def test_another_store_writing_the_run_notices_the_delete(tmp_path: Path) -> None:
    deleter, writer = FileStepStore(tmp_path), FileStepStore(tmp_path)
    messages = history(3)
    await write_run(writer, 'shared', messages[:3])
    await writer.append_event(StepEvent(run_id='shared', kind=EventKind.MODEL_REQUEST_STARTED, step_index=0))

    assert await deleter.delete_run('shared') is True
    # The writer's cached positions and history point into the deleted folder: it starts afresh.
    await writer.append_event(
        StepEvent(run_id='shared', kind=EventKind.RUN_STARTED, idempotency_key='start', step_index=0)
    )
    await writer.save_snapshot(
        ContinuableSnapshot(run_id='shared', messages=messages, idempotency_key='k', step_index=0)
    )
    assert [(e.seq, e.kind) for e in await deleter.list_events('shared')] == [(1, EventKind.RUN_STARTED)]
    latest = await deleter.latest_snapshot('shared')
    assert latest is not None
    assert (latest.seq, latest.messages) == (1, messages)
    lines = (tmp_path / 'shared' / 'messages.jsonl').read_text().splitlines()
    assert len(lines) == len(messages)
    await deleter.aclose()
    await writer.aclose()


async def test_a_folder_left_by_an_interrupted_delete_is_removed_by_the_next_one(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await write_run(store, 'gone', history(1))
    # A delete that died after moving the folder aside, before removing it.
    leftover = tmp_path / '.gone.deleted.0123456789abcdef'
    (tmp_path / 'gone').rename(leftover)
    assert [r.run_id for r in await store.list_runs()] == [], 'a folder moved aside is no run'
    await write_run(store, 'gone', history(2))
    assert await store.delete_run('gone') is True
    assert sorted(p.name for p in tmp_path.iterdir()) == [], 'both the deleted folder and the leftover are gone'
    await store.aclose()
