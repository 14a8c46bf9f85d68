"""WorkerThread: a store's own thread for blocking calls."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from stepcore.worker import WorkerThread


def _pause() -> None:
    time.sleep(0.01)


async def test_calls_run_off_the_loop_one_at_a_time_in_order() -> None:
    worker = WorkerThread('test-worker')
    seen: list[tuple[int, str]] = []
    running = 0
    overlap = False

    def work(i: int) -> int:
        nonlocal running, overlap
        running += 1
        overlap = overlap or running > 1
        seen.append((i, threading.current_thread().name))
        time.sleep(0.001)
        running -= 1
        return i * i

    results = await asyncio.gather(*(worker.run(work, i) for i in range(20)))
    assert results == [i * i for i in range(20)]
    assert [i for i, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {'test-worker'}
    assert not overlap
    worker.close()


async def test_an_exception_reaches_the_caller_and_the_thread_goes_on() -> None:
    worker = WorkerThread('test-worker')

    def fail() -> None:
        raise ValueError('bad value 42')

    with pytest.raises(ValueError, match='bad value 42'):
        await worker.run(fail)
    assert await worker.run(lambda: 'still here') == 'still here'
    worker.close()


async def test_a_cancelled_caller_leaves_the_running_call_to_finish() -> None:
    worker = WorkerThread('test-worker')
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(5)
        finished.append('done')
        return 'late'

    task = asyncio.ensure_future(worker.run(slow))
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert await worker.run(lambda: 'next') == 'next'  # queued behind the cancelled call
    assert finished == ['done']
    worker.close()


async def test_enqueued_jobs_run_after_queued_calls_and_failures_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    worker = WorkerThread('test-worker')
    order: list[str] = []

    def broken() -> None:
        order.append('broken')
        raise OSError('disk gone')

    pending = asyncio.ensure_future(worker.run(order.append, 'call'))
    await asyncio.sleep(0)
    worker.enqueue(lambda: order.append('job'))
    worker.enqueue(broken)
    await pending
    await worker.run(order.append, 'after')
    assert order == ['call', 'job', 'broken', 'after']
    assert 'background call' in caplog.text
    assert 'disk gone' in caplog.text
    worker.close()


async def test_close_finishes_queued_calls_and_a_later_call_starts_a_new_thread() -> None:
    worker = WorkerThread('test-worker')
    first = await worker.run(threading.get_ident)
    worker.enqueue(_pause)
    worker.close()
    second = await worker.run(threading.get_ident)
    assert second != first
    worker.close()


async def test_a_dropped_worker_stops_its_thread() -> None:
    async def use() -> None:
        await WorkerThread('dropped-worker').run(lambda: None)

    await use()  # the worker is freed with the coroutine: nothing else refers to it
    for thread in [t for t in threading.enumerate() if t.name == 'dropped-worker']:
        await asyncio.to_thread(thread.join, 5)
        assert not thread.is_alive()
