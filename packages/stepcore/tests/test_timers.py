"""Timers: the recovery loop applies approval deadlines, and (opt-in) resumes answered runs itself."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.tools import DeferredToolRequests

from stepcore import (
    InMemoryStepStore,
    OrphanOutcome,
    StepPersistence,
    apply_deadlines,
    approve_call,
    list_waiting,
    read_waiting,
    ready_to_resume,
    run_recovery_loop,
)
from stepcore.store.leases import LeaseState
from stepcore_conformance.capability import function_model


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
    if returns:
        return ModelResponse(parts=[TextPart(f'told: {returns[-1].content}')])
    return ModelResponse(parts=[ToolCallPart('drop_table', {'name': 'users_2019'}, tool_call_id='drop-1')])


class Ops:
    def __init__(self, store: InMemoryStepStore, *, within: float | None) -> None:
        self.dropped: list[str] = []
        self.agent = Agent(
            function_model(_model),
            name='ops',
            output_type=[str, DeferredToolRequests],
            capabilities=[StepPersistence(store=store, answer_within=within)],
        )

        @self.agent.tool_plain(requires_approval=True)
        def drop_table(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
            self.dropped.append(name)
            return f'dropped {name}'

    async def pause(self) -> str:
        result = await self.agent.run('drop the old table')
        assert isinstance(result.output, DeferredToolRequests)
        return result.run_id


class Seen(list[OrphanOutcome]):
    def __init__(self) -> None:
        super().__init__()
        self.arrived = asyncio.Event()

    def add(self, outcome: OrphanOutcome) -> None:
        self.append(outcome)
        self.arrived.set()

    async def until(self, kind: str, seconds: float = 10.0) -> OrphanOutcome:
        async with asyncio.timeout(seconds):
            while not (found := [o for o in self if o.outcome == kind]):
                self.arrived.clear()
                await self.arrived.wait()
        return found[0]


async def _loop(
    store: InMemoryStepStore, ops: Ops, seen: Seen, **options: Any
) -> tuple[asyncio.Task[None], asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_recovery_loop(store, [ops.agent], interval=0.05, stop=stop, on_outcome=seen.add, **options)
    )
    return task, stop


async def test_the_loop_records_a_deadline_as_it_falls_due_and_the_call_stays_visible() -> None:
    store = InMemoryStepStore()
    ops = Ops(store, within=0.2)
    run_id = await ops.pause()
    seen = Seen()
    loop, stop = await _loop(store, ops, seen)
    try:
        expired = await seen.until('expired')
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)
    assert (expired.run_id, expired.detail) == (run_id, 'drop_table (drop-1) passed its deadline unanswered')
    assert [o.outcome for o in seen] == ['expired']  # recorded once; nothing resumed it
    waiting = await read_waiting(store, run_id=run_id)
    assert waiting is not None
    answer = waiting.answers['drop-1']
    assert (answer.decision, answer.by) == ('expired', 'stepcore (deadline)')
    assert [c.tool_call_id for c in waiting.expired()] == ['drop-1']  # still shown, as expired
    assert waiting.unanswered() == ()
    assert [w.run_id for w in await list_waiting(store)] == [run_id]  # the run still waits to be resumed
    assert ops.dropped == []


async def test_resume_answered_resumes_a_run_once_its_calls_are_answered() -> None:
    store = InMemoryStepStore()
    ops = Ops(store, within=None)
    run_id = await ops.pause()
    seen = Seen()
    loops = [await _loop(store, ops, seen, resume_answered=True) for _ in range(2)]  # two workers
    try:
        await asyncio.sleep(0.2)
        assert seen == []  # nothing answered yet: nothing to do
        await approve_call(store, run_id=run_id, tool_call_id='drop-1', by='alice')
        resumed = await seen.until('resumed')
        await asyncio.sleep(0.2)
    finally:
        for task, stop in loops:
            stop.set()
            await asyncio.wait_for(task, 10)
    assert resumed.run_id == run_id
    assert [o.outcome for o in seen if o.outcome == 'resumed'] == ['resumed']  # one worker resumed it
    assert ops.dropped == ['users_2019']
    lease = await store.get_lease(run_id)
    assert lease is not None
    assert lease.state is LeaseState.RESUMED
    assert await list_waiting(store) == []


async def test_resume_answered_resumes_a_run_whose_calls_expired_with_the_denial() -> None:
    store = InMemoryStepStore()
    ops = Ops(store, within=0.15)
    run_id = await ops.pause()
    seen = Seen()
    loop, stop = await _loop(store, ops, seen, resume_answered=True)
    try:
        resumed = await seen.until('resumed')
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)
    assert resumed.run_id == run_id
    assert 'told: The request to run drop_table was not answered before its deadline' in resumed.detail
    assert ops.dropped == []


async def test_apply_deadlines_and_ready_to_resume_by_hand() -> None:
    store = InMemoryStepStore()
    ops = Ops(store, within=0.05)
    run_id = await ops.pause()
    assert await ready_to_resume(store) == []
    await asyncio.sleep(0.1)
    first = await apply_deadlines(store)
    assert [(e.run_id, e.call.tool_call_id, e.recorded) for e in first] == [(run_id, 'drop-1', True)]
    assert await apply_deadlines(store) == []  # recorded once
    assert [w.run_id for w in await ready_to_resume(store)] == [run_id]


async def test_the_watch_reads_a_waiting_run_again_only_when_it_changed(monkeypatch: Any) -> None:
    from stepcore.recovery import timers

    store = InMemoryStepStore()
    ops = Ops(store, within=0.3)
    run_id = await ops.pause()
    reads: list[str] = []
    real = timers.read_waiting

    async def counted(store: Any, *, run_id: str) -> Any:
        reads.append(run_id)
        return await real(store, run_id=run_id)

    monkeypatch.setattr(timers, 'read_waiting', counted)
    watch = timers.WaitingWatch()
    for _ in range(5):
        expiries, waiting = await watch.due_now(store)
        assert (expiries, [w.run_id for w in waiting]) == ([], [run_id])
    assert reads == [run_id], 'read once while nothing changed'
    await asyncio.sleep(0.35)  # its deadline comes: read again, the expiry recorded, read with it
    expiries, waiting = await watch.due_now(store)
    assert [(e.run_id, e.recorded) for e in expiries] == [(run_id, True)]
    assert [w.answers['drop-1'].decision for w in waiting] == ['expired']
    assert reads == [run_id] * 3
    await watch.due_now(store)
    assert len(reads) == 3
    # an answer appended to a run is an event: the run is read again
    other = await ops.pause()
    await watch.due_now(store)
    await approve_call(store, run_id=other, tool_call_id='drop-1')
    await watch.due_now(store)
    assert reads[3:] == [other, other]
