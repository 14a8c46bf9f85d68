"""The crash window: a write stopped at any point leaves a state that keeps the crash rule.

The crash rule: a tool call is recorded `completed` only in the same atomic write as, or after,
the snapshot holding its result. So whatever a crash leaves, every `completed` ledger entry's call
has its result in the latest complete snapshot, or the call is still `started` and reported by
`list_unresolved_tool_effects` and `inspect_recovery` (`support.check_crash_rule`).

Two tests, both through the fault points of `stepcore.engine`, for a store declaring the feature
`engine_port` (every `EngineStore` does; a store that does not has no fault points, and skips them
with that reason):

- a tool cycle written as `StepPersistence` writes it (the call's `started` entry and event in one
  `write_batch`, then its `completed` entry and event with the snapshot holding its result in
  another) is stopped at each boundary of the second write in turn;
- for a `persistent` store, a real process running a real agent is SIGKILLed at each write
  boundary of the run in turn, until a run gets through; each child is forked from one zygote
  process (`_crash_zygote`) that imported everything once.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart

from stepcore import (
    ContinuableSnapshot,
    EngineStore,
    EventKind,
    StepEvent,
    StepStore,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.backend import ENGINE_PORT, PERSISTENT, InjectedFault, StepWrite, boundaries, inject_faults, stop_at

from ._crash_agent import FINAL_ANSWER, TOOL_CALLS
from ._support import StoreFixtures, at, needs_feature, new_id, other_store, register, snapshot, user
from .forkserver import Zygote, zygote
from .report import SUMMARY_PROPERTY
from .support import check_crash_rule

__all__ = ('CrashWindowConformance',)

CALL = 'call-1'
MAX_BOUNDARIES = 2000
"""A run with more write boundaries than this is taken as one that never ends."""
REPLY_TIMEOUT_SECONDS = 120
"""How long one child may take (a guard against a hang, not a performance bound)."""


class _Cycle:
    """One tool cycle of a run, as `StepPersistence` writes it."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        started = ToolEffectRecord(
            run_id=run_id,
            tool_call_id=CALL,
            tool_name='lookup',
            status=ToolEffectStatus.STARTED,
            started_at=at(1),
            updated_at=at(1),
            step_index=1,
            args={'q': 'x'},
        )
        self.prompt = user('look x up')
        self.call = ModelResponse(parts=[ToolCallPart('lookup', {'q': 'x'}, tool_call_id=CALL)], timestamp=at(1))
        self.first: list[StepWrite] = [started, self._event(EventKind.TOOL_CALL_STARTED)]
        self.second: list[StepWrite] = [
            dataclasses.replace(started, status=ToolEffectStatus.COMPLETED, updated_at=at(2), ended_at=at(2)),
            self._event(EventKind.TOOL_CALL_COMPLETED),
        ]
        result = ModelRequest(parts=[ToolReturnPart('lookup', 'x is 42', tool_call_id=CALL, timestamp=at(2))])
        self.snapshot: ContinuableSnapshot = snapshot(
            run_id, [self.prompt, self.call, result], step_index=1, idempotency_key='snapshot:1'
        )

    def _event(self, kind: EventKind) -> StepEvent:
        return StepEvent(
            run_id=self.run_id,
            kind=kind,
            step_index=1,
            timestamp=at(1),
            tool_name='lookup',
            tool_call_id=CALL,
            idempotency_key=f'{kind.value}:{CALL}',
        )

    async def begin(self, store: StepStore) -> None:
        """Register the run, save its first complete snapshot (the prompt), write the call's start."""
        await register(store, self.run_id)
        await store.save_snapshot(snapshot(self.run_id, [self.prompt], step_index=0, idempotency_key='snapshot:0'))
        await store.write_batch(self.first)

    async def finish(self, store: StepStore) -> None:
        """Write the call's end with the snapshot holding its result."""
        await store.write_batch(self.second, snapshot=self.snapshot)


def _zygote(spec: dict[str, Any], workdir: Path) -> AbstractAsyncContextManager[Zygote]:
    """The fork server of `_crash_zygote` for `spec`."""
    args = ('-m', 'stepcore_conformance._crash_zygote', json.dumps(spec))
    return zygote(args, workdir / 'crash-zygote.stderr', reply_seconds=REPLY_TIMEOUT_SECONDS)


class CrashWindowConformance(StoreFixtures):
    """After a write stopped at any of its steps, or a process killed at any of them, the crash rule holds."""

    @needs_feature(ENGINE_PORT)
    async def test_a_write_stopped_at_any_boundary_keeps_the_crash_rule(
        self, store: StepStore, store_spec: dict[str, Any] | None
    ) -> None:
        engine = cast(EngineStore, store)  # the engine's fault points stop a write between its steps
        probe = _Cycle(new_id('probe'))
        await probe.begin(engine)
        passed = await boundaries(engine, lambda: probe.finish(engine))
        assert passed, f'{type(store).__name__} wrote a tool cycle without passing any write boundary'
        for index, name in enumerate(passed):
            where = f'the write of the completed entry and its snapshot stopped at boundary {index} ({name!r})'
            cycle = _Cycle(new_id('stopped'))
            await cycle.begin(engine)
            stopped = False
            with inject_faults(engine, stop_at(index)):
                try:
                    await cycle.finish(engine)
                except InjectedFault:
                    stopped = True
            assert stopped, f'{where}: the boundary was not reached again (boundaries: {passed})'
            async with other_store(store, store_spec) as reader:
                effects = await check_crash_rule(reader, cycle.run_id, context=where)
                assert [e.tool_call_id for e in effects] == [CALL], f'{where}: the ledger lost the call: {effects}'
            # Written again (as a recovering run would), the cycle ends complete, every record once.
            await cycle.finish(engine)
            async with other_store(store, store_spec) as reader:
                [entry] = await check_crash_rule(reader, cycle.run_id, context=f'{where}, then written again')
                assert entry.status is ToolEffectStatus.COMPLETED, f'{where}, then written again: {entry}'
                kinds = [e.kind for e in await reader.list_events(cycle.run_id)]
                assert kinds == [EventKind.TOOL_CALL_STARTED, EventKind.TOOL_CALL_COMPLETED], f'{where}: {kinds}'
                steps = [s.step_index for s in await reader.list_snapshots(cycle.run_id, include_interrupted=True)]
                assert steps == [0, 1], f'{where}, then written again: snapshots of steps {steps}'

    @needs_feature(PERSISTENT, ENGINE_PORT)
    async def test_a_process_killed_at_any_boundary_keeps_the_crash_rule(
        self,
        store: StepStore,
        store_spec: dict[str, Any] | None,
        tmp_path: Path,
        record_property: Callable[[str, object], None],
    ) -> None:
        assert store_spec is not None  # the feature gate fails a persistent store without one
        prefix = new_id('killed')
        began = time.perf_counter()
        kills = 0
        broken: list[str] = []
        startup = 0.0
        async with _zygote(store_spec, tmp_path) as server, other_store(store, store_spec) as reader:
            startup = time.perf_counter() - began
            for k in range(MAX_BOUNDARIES):
                run_id = f'{prefix}-{k}'
                reply = await server.run({'k': k, 'run_id': run_id})
                if reply['killed']:
                    kills += 1
                    try:
                        await check_crash_rule(reader, run_id, context=f'process SIGKILLed at write boundary {k}')
                    except AssertionError as error:
                        broken.append(str(error).splitlines()[0])
                    continue
                if reply['exit'] != 0:
                    pytest.fail(server.failure(f'the agent run stopped at boundary {k} failed (exit {reply["exit"]})'))
                # The hook never fired: the run went through. It must have ended complete.
                effects = await check_crash_rule(reader, run_id, context='the run that was not killed')
                assert sorted((e.tool_call_id, e.status) for e in effects) == [
                    (call, ToolEffectStatus.COMPLETED) for call in TOOL_CALLS
                ]
                latest = await reader.latest_snapshot(run_id)
                assert latest is not None
                answer = [p.content for p in latest.messages[-1].parts if isinstance(p, TextPart)]
                assert answer == [FINAL_ANSWER], f'the run that was not killed ended with {latest.messages[-1]}'
                break
            else:
                pytest.fail(f'the agent run was still writing after {MAX_BOUNDARIES} write boundaries')
        seconds = time.perf_counter() - began
        held = 'the crash rule held after every kill' if not broken else f'the crash rule broke after {len(broken)}'
        record_property(
            SUMMARY_PROPERTY,
            f'crash window: {kills} processes SIGKILLed, one at each write boundary of an agent run; {held} '
            f'({seconds:.1f} s, {startup:.1f} s of it starting the zygote process)',
        )
        assert kills > 0, 'the agent run passed no write boundary'
        assert not broken, f'the crash rule broke after {len(broken)} of {kills} kills:\n' + '\n'.join(broken)
