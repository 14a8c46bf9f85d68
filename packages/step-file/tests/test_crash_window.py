"""A save stopped at each of its writes (the engine's boundaries and the file port's own) leaves a
run that reads back whole and obeys the crash rule; the same save retried then completes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

from step_file import FileStepStore
from step_file.store import FilePort
from stepcore import (
    ContinuableSnapshot,
    EventKind,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.engine import KeyConflict
from stepcore.engine._ops import PutSnapshot, SnapshotRow
from stepcore.engine.faults import InjectedFault, boundaries, inject_faults, stop_at

MESSAGES: list[ModelMessage] = [
    ModelRequest(parts=[UserPromptPart('go')]),
    ModelResponse(parts=[ToolCallPart('fetch', {'n': 0}, tool_call_id='call-0')]),
    ModelRequest(parts=[ToolReturnPart('fetch', 'result 0', tool_call_id='call-0')]),
]


async def started(store: FileStepStore) -> None:
    """A run whose tool call is started and saved in the snapshot holding the call."""
    await store.record_tool_effect(
        ToolEffectRecord(run_id='crash', tool_call_id='call-0', tool_name='fetch', status=ToolEffectStatus.STARTED)
    )
    await store.save_snapshot(
        ContinuableSnapshot(run_id='crash', messages=MESSAGES[:2], idempotency_key='k1', step_index=0)
    )


async def settle(store: FileStepStore) -> None:
    """The tool cycle settles: its result's snapshot, its completed ledger entry and its event, in one batch."""
    await store.write_batch(
        [
            ToolEffectRecord(
                run_id='crash', tool_call_id='call-0', tool_name='fetch', status=ToolEffectStatus.COMPLETED
            ),
            StepEvent(run_id='crash', kind=EventKind.TOOL_CALL_COMPLETED, tool_call_id='call-0', step_index=0),
        ],
        snapshot=ContinuableSnapshot(run_id='crash', messages=MESSAGES, idempotency_key='k2', step_index=0),
    )


async def test_the_save_passes_the_file_ports_own_boundaries(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await started(store)
    assert await boundaries(store, lambda: settle(store)) == [
        'put_snapshot',
        'put_snapshot:nodes',
        'put_snapshot:file',
        'put_effects',
        'put_events',
        'commit',
        'committed',
    ]
    await store.aclose()


@pytest.mark.parametrize('index', range(7))
async def test_a_save_stopped_at_any_boundary(tmp_path: Path, index: int) -> None:
    store = FileStepStore(tmp_path)
    await started(store)
    with inject_faults(store, stop_at(index)), pytest.raises(InjectedFault):
        await settle(store)
    await store.aclose()

    fresh = FileStepStore(tmp_path)
    latest = await fresh.latest_snapshot('crash')
    assert latest is not None
    assert latest.messages in (MESSAGES[:2], MESSAGES)
    effect = await fresh.get_tool_effect('crash', 'call-0')
    assert effect is not None
    if effect.status is ToolEffectStatus.COMPLETED:  # the crash rule
        assert latest.messages == MESSAGES
    leftovers = [p.name for p in (tmp_path / 'crash').rglob('*') if p.name.endswith('.tmp')]
    assert leftovers == [], 'a stopped save leaves no temporary file'

    await settle(fresh)  # the retry completes (or is suppressed by its key, once the key line is there)
    latest = await fresh.latest_snapshot('crash')
    assert latest is not None
    assert latest.messages == MESSAGES
    assert await fresh.list_unresolved_tool_effects('crash') == []
    assert EventKind.TOOL_CALL_COMPLETED in [e.kind for e in await fresh.list_events('crash')]
    await fresh.aclose()


async def test_put_snapshot_refuses_a_key_another_process_recorded_meanwhile(tmp_path: Path) -> None:
    store, other = FileStepStore(tmp_path), FileStepStore(tmp_path)
    await store.save_snapshot(
        ContinuableSnapshot(run_id='keys', messages=MESSAGES[:1], idempotency_key='k1', step_index=0)
    )
    await other.save_snapshot(
        ContinuableSnapshot(run_id='keys', messages=MESSAGES[:2], idempotency_key='k2', step_index=0)
    )
    port = store.port
    assert isinstance(port, FilePort)
    row = SnapshotRow('keys', SnapshotState.COMPLETE.value, None, 0, b'{"format":1}')

    def put() -> None:
        with port.transaction(['keys']) as tx:
            port.put_snapshot(tx, PutSnapshot('keys', 'k2', None, [], row))

    with pytest.raises(KeyConflict):
        await port.call(put)
    assert sorted(p.name for p in (tmp_path / 'keys' / 'snapshots').iterdir()) == ['1.json', '2.json']
    await store.aclose()
    await other.aclose()
