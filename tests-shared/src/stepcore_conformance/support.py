"""Helpers for a backend's own tests, beyond the conformance classes.

Import them in your test modules (`from stepcore_conformance.support import ...`); the kit's
sections use them too, so a backend's extra tests and the kit check the same things the same way.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    StepStore,
    ToolEffectRecord,
    ToolEffectStatus,
    inspect_recovery,
)

__all__ = (
    'ONE_TOOL_CALL_RUN_EVENTS',
    'check_crash_rule',
    'check_tool_steps',
    'kill_when_ready',
    'write_tool_steps',
)

ONE_TOOL_CALL_RUN_EVENTS: tuple[EventKind, ...] = (
    EventKind.RUN_STARTED,
    EventKind.MODEL_REQUEST_STARTED,
    EventKind.MODEL_REQUEST_COMPLETED,
    EventKind.TOOL_CALL_STARTED,
    EventKind.TOOL_CALL_COMPLETED,
    EventKind.MODEL_REQUEST_STARTED,
    EventKind.MODEL_REQUEST_COMPLETED,
    EventKind.RUN_COMPLETED,
)
"""The event kinds, in order, of an agent run whose model calls one tool and then answers."""


async def kill_when_ready(
    process: asyncio.subprocess.Process, ready: Path, *, polls: int, failure: str, stderr_tail: int = 2000
) -> None:
    """SIGKILL `process` once it creates the file `ready`, and check that the signal is what ended it.

    Polls every 50 ms, `polls` times at most. When `ready` never appears (or the process exits
    first) the test fails with `failure`, followed by the last `stderr_tail` characters of the
    process's stderr (open it with `stderr=PIPE`). The process is always reaped, killed if need be.
    """
    try:
        for _ in range(polls):
            if ready.exists() or process.returncode is not None:
                break
            await asyncio.sleep(0.05)
        if not ready.exists():
            # Stop it first: a process still on its way would keep its stderr open, and reading to
            # the end would wait for it forever.
            if process.returncode is None:
                process.kill()
                await process.wait()
            assert process.stderr is not None
            if process.returncode is None:
                process.kill()  # its stderr ends only when it does
                await process.wait()
            detail = (await process.stderr.read()).decode()[-stderr_tail:]
            pytest.fail(f'{failure} (within {polls * 0.05:.0f} s): {detail}')
        os.kill(process.pid, signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def _result(run_id: str, i: int) -> str:
    return f'{run_id} result {i} ' * 40


async def write_tool_steps(
    store: StepStore, run_id: str, steps: int, *, conversation_id: str | None = None, snapshot_keys: bool = False
) -> None:
    """Register `run_id` and record `steps` settled tool calls the way a run would.

    Each step appends a TOOL_CALL_STARTED event, a started effect, the call and its return, the
    completed effect, a TOOL_CALL_COMPLETED event and a snapshot of the history so far (with the
    idempotency key `s<i>` when `snapshot_keys`). Used by the multi-process writer tests; check the
    result with `check_tool_steps`.
    """
    await store.register_run(RunRecord(run_id=run_id, conversation_id=conversation_id))
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(f'start {run_id}')])]
    for i in range(steps):
        call = f'{run_id}-{i}'
        await store.append_event(StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_STARTED, step_index=i))
        await store.record_tool_effect(
            ToolEffectRecord(run_id=run_id, tool_call_id=call, tool_name='work', status=ToolEffectStatus.STARTED)
        )
        messages.append(ModelResponse(parts=[ToolCallPart('work', {'i': i}, tool_call_id=call)]))
        messages.append(ModelRequest(parts=[ToolReturnPart('work', _result(run_id, i), tool_call_id=call)]))
        await store.record_tool_effect(
            ToolEffectRecord(run_id=run_id, tool_call_id=call, tool_name='work', status=ToolEffectStatus.COMPLETED)
        )
        await store.append_event(StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_COMPLETED, step_index=i))
        await store.save_snapshot(
            ContinuableSnapshot(
                run_id=run_id, step_index=i, messages=list(messages), idempotency_key=f's{i}' if snapshot_keys else None
            )
        )


async def check_tool_steps(store: StepStore, run_id: str, steps: int) -> None:
    """Assert that `store` holds exactly what `write_tool_steps(store, run_id, steps)` wrote, nothing lost."""
    events = await store.list_events(run_id=run_id)
    assert [e.seq for e in events] == list(range(1, 2 * steps + 1))
    assert [(e.kind, e.step_index) for e in events] == [
        (kind, i) for i in range(steps) for kind in (EventKind.TOOL_CALL_STARTED, EventKind.TOOL_CALL_COMPLETED)
    ]
    effects = await store.list_tool_effects(run_id=run_id)
    assert [e.tool_call_id for e in effects] == [f'{run_id}-{i}' for i in range(steps)]
    assert all(e.status is ToolEffectStatus.COMPLETED for e in effects)
    assert await store.list_unresolved_tool_effects(run_id=run_id) == []
    snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)
    seqs = [s.seq for s in snapshots if s.seq is not None]
    assert len(seqs) == len(snapshots)  # every listed snapshot carries its store-assigned seq
    assert seqs == sorted(set(seqs))  # increasing per run; gapless is a backend's own promise, if it makes it
    assert [s.step_index for s in snapshots] == list(range(steps))
    assert all(s.state is SnapshotState.COMPLETE for s in snapshots)
    latest = await store.latest_snapshot(run_id=run_id)
    assert latest is not None
    assert latest.messages == snapshots[-1].messages
    assert len(latest.messages) == 1 + 2 * steps
    assert all(f'{run_id} result' in str(m) for m in latest.messages[2::2])
    assert f'{run_id} result {steps - 1}' in str(latest.messages[-1])


async def check_crash_rule(store: StepStore, run_id: str, *, context: str = '') -> list[ToolEffectRecord]:
    """Assert the crash rule on what `store` holds for `run_id`; returns the run's ledger entries.

    Every `completed` ledger entry's call has its tool return in the messages of
    `latest_snapshot(run_id)` (the newest complete snapshot); every entry that is not is still
    `started`, and `list_unresolved_tool_effects` and `inspect_recovery` both report it. Call it on
    whatever a crash left behind (`context` is added to a failure message, e.g. where it stopped).
    """
    where = f' ({context})' if context else ''
    effects = await store.list_tool_effects(run_id=run_id)
    latest = await store.latest_snapshot(run_id=run_id)
    returned = {
        part.tool_call_id
        for message in (latest.messages if latest is not None else [])
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    unresolved = {e.tool_call_id for e in await store.list_unresolved_tool_effects(run_id=run_id)}
    recovery = await inspect_recovery(store=store, run_id=run_id)
    reported = {e.tool_call_id for e in recovery.unresolved_effects}
    for entry in effects:
        call = entry.tool_call_id
        if entry.status is ToolEffectStatus.COMPLETED:
            assert call in returned, (
                f'run {run_id!r}{where}: tool call {call!r} is recorded completed but its result is not in the latest '
                f'complete snapshot (seq {latest.seq if latest else None}): a completed entry must be written with or '
                'after the snapshot holding the result'
            )
        elif entry.status is ToolEffectStatus.STARTED:
            assert call in unresolved, (
                f'run {run_id!r}{where}: started call {call!r} missing from list_unresolved_tool_effects'
            )
            assert call in reported, f'run {run_id!r}{where}: started call {call!r} missing from inspect_recovery'
    return effects
