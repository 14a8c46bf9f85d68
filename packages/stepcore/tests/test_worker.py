"""WorkerThread: a store's own thread for blocking calls."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from stepcore.backend_io.worker import WorkerThread, WouldBlock, running_inline


def _pause() -> None:
    time.sleep(0.01)


async def _hold(worker: WorkerThread, marks: list[str], mark: str) -> tuple[asyncio.Future[str], threading.Event]:
    """Start a call that holds the worker's thread until the returned event is set, then appends
    `mark` to `marks` and returns `'late'`; returns once the call is running."""
    started, release = threading.Event(), threading.Event()

    def hold() -> str:
        started.set()
        release.wait(5)
        marks.append(mark)
        return 'late'

    call = asyncio.ensure_future(worker.run(hold))
    await asyncio.to_thread(started.wait, 5)
    return call, release


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
    finished: list[str] = []
    task, release = await _hold(worker, finished, 'done')
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


async def test_a_call_runs_inline_on_the_callers_thread_when_the_worker_is_idle() -> None:
    worker = WorkerThread('test-worker')
    await worker.run(lambda: None)  # the thread exists and is idle
    done, result = worker.try_inline(lambda x: (x * 2, threading.current_thread().name), 21)
    assert done
    assert result == (42, threading.current_thread().name)
    worker.close()


async def test_no_inline_call_while_a_call_is_queued_or_running() -> None:
    worker = WorkerThread('test-worker')
    order: list[str] = []
    running, release = await _hold(worker, order, 'slow')
    queued = asyncio.ensure_future(worker.run(order.append, 'queued'))
    await asyncio.sleep(0)
    assert worker.try_inline(order.append, 'inline') == (False, None)  # running and queued
    release.set()
    await asyncio.gather(running, queued)
    assert worker.try_inline(order.append, 'inline') == (True, None)
    assert order == ['slow', 'queued', 'inline']  # the refused call did not run; order kept
    worker.close()


async def test_an_inline_call_that_would_block_is_refused_and_other_errors_propagate() -> None:
    worker = WorkerThread('test-worker')
    seen: list[bool] = []

    def needs_to_wait() -> None:
        seen.append(running_inline())
        raise WouldBlock

    assert worker.try_inline(needs_to_wait) == (False, None)
    assert seen == [True]
    assert not running_inline()  # the flag is only up during the inline call

    def broken() -> None:
        raise ValueError('bad value 7')

    with pytest.raises(ValueError, match='bad value 7'):
        worker.try_inline(broken)
    assert worker.try_inline(lambda: 'free again') == (True, 'free again')  # the gate was released
    worker.close()


async def test_a_call_on_the_thread_waits_for_an_inline_call_to_end() -> None:
    worker = WorkerThread('test-worker')
    inside = threading.Event()
    order: list[str] = []

    def inline_work() -> None:
        # another thread submits while this runs inline: its call must not overlap this one
        threading.Thread(target=lambda: (inside.set(), worker.enqueue(lambda: order.append('thread')))).start()
        inside.wait(5)
        time.sleep(0.05)
        order.append('inline')

    assert worker.try_inline(inline_work) == (True, None)
    await worker.run(lambda: None)  # behind the enqueued call
    assert order == ['inline', 'thread']
    worker.close()


async def test_wait_idle_returns_once_nothing_is_queued_or_running() -> None:
    worker = WorkerThread('test-worker')
    assert await worker.wait_idle() is False  # idle: returns at once
    marks: list[str] = []
    running, release = await _hold(worker, marks, 'held')
    queued = asyncio.ensure_future(worker.run(marks.append, 'queued'))
    idle = asyncio.ensure_future(worker.wait_idle())
    await asyncio.sleep(0.02)
    assert not idle.done()
    release.set()
    assert await asyncio.wait_for(idle, 5) is True
    assert running.done()
    assert queued.done()  # both calls had finished
    assert marks == ['held', 'queued']
    assert worker.try_inline(lambda: 'inline') == (True, 'inline')
    worker.close()
