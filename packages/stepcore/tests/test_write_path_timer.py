"""The deferred-write timer of `RunWriter`: one pending timer that a write does not cancel.

A write clears the due time instead of cancelling the timer; the timer, when it fires, writes the
deferred records only once they have waited `DEFERRED_WRITE_DELAY`, else waits on for them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from stepcore import EventKind, InMemoryStepStore, StepEvent
from stepcore.capability import run_writer
from stepcore.capability.run_writer import RunWriter

RUN = 'run-t'
NO_CTX = cast(Any, None)  # events only: no snapshot is announced, so no context is used


def event(n: int) -> StepEvent:
    return StepEvent(run_id=RUN, kind=EventKind.MODEL_REQUEST_COMPLETED, step_index=n, idempotency_key=f'e:{n}')


async def written(store: InMemoryStepStore) -> list[int]:
    return [e.step_index for e in await store.list_events(RUN)]


def writer_on(store: InMemoryStepStore) -> RunWriter:
    return RunWriter(store, cast(Any, None), journaled=False, run_id=RUN)


async def test_a_deferral_after_a_write_waits_its_own_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    delay = 0.5
    monkeypatch.setattr(run_writer, 'DEFERRED_WRITE_DELAY', delay)
    store = InMemoryStepStore()
    writer = writer_on(store)
    start = time.monotonic()
    await writer.defer(NO_CTX, event(1))  # the timer is set for start + delay
    await asyncio.sleep(delay / 5)
    await writer.write(NO_CTX, event(2))  # takes event 1 along
    assert await written(store) == [1, 2]
    deferred_at = time.monotonic()
    await writer.defer(NO_CTX, event(3))  # due deferred_at + delay, after the pending timer
    await asyncio.sleep(max(0.0, start + delay * 1.5 - time.monotonic()))
    if time.monotonic() - deferred_at < delay * 0.9:  # the machine did not stall us past its due time
        assert await written(store) == [1, 2]  # the first timer fired and waits on for event 3
    await asyncio.sleep(max(0.0, deferred_at + delay * 2 - time.monotonic()))
    assert await written(store) == [1, 2, 3]


async def test_deferring_and_writing_many_times_sets_one_timer() -> None:
    store = InMemoryStepStore()
    writer = writer_on(store)
    loop = asyncio.get_running_loop()
    scheduled: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if getattr(callback, '__self__', None) is writer:  # not the test's own sleeps
            scheduled.append(when)
        return call_at(when, callback, *args, **kwargs)

    loop.call_at = counting  # type: ignore[method-assign]
    try:
        for n in range(0, 40, 2):
            await writer.defer(NO_CTX, event(n))
            await writer.write(NO_CTX, event(n + 1))
        await writer.defer(NO_CTX, event(40))
        await asyncio.sleep(run_writer.DEFERRED_WRITE_DELAY * 10)
    finally:
        del loop.call_at
    assert await written(store) == list(range(41))
    assert 1 <= len(scheduled) <= 2  # the first timer, and maybe one it re-armed for the last deferral


def test_a_writer_used_on_a_second_event_loop_sets_a_timer_there() -> None:
    store = InMemoryStepStore()
    writer = writer_on(store)

    async def first() -> None:
        await writer.defer(NO_CTX, event(1))
        await writer.write(NO_CTX, event(2))  # the timer stays pending on this loop, which then closes

    async def second() -> list[int]:
        await writer.defer(NO_CTX, event(3))
        await asyncio.sleep(run_writer.DEFERRED_WRITE_DELAY * 10)
        return await written(store)

    asyncio.run(first())
    assert asyncio.run(second()) == [1, 2, 3]
