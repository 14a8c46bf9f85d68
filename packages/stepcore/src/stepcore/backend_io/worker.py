"""A store's own worker thread: blocking calls run off the event loop, one at a time, in order.

Under asyncio a call is handed over through a plain queue and its result comes back with one
`call_soon_threadsafe`, which is cheaper than an executor's or `anyio.to_thread`'s hand-off: that
matters at two store calls per agent step. Under any other event loop (trio) calls go through
`anyio.to_thread.run_sync`.

The thread starts with the first call and stops when the worker is closed or garbage-collected;
a call after `close()` starts a new one. Cancelling an awaiting task does not stop a call that is
already running: it finishes on the thread and its result is dropped.

`try_inline` runs a short call on the caller's own thread instead, when the worker is idle (no call
running or queued), so the calls still run one at a time and in order. Under many concurrent runs
that saves more than the hand-off: both threads would otherwise contend for the GIL at every call.
Code a call runs can ask `running_inline()` to avoid waiting (for a lock, say) on the event loop: it
raises `WouldBlock` instead, and the caller hands the call to the thread. A caller that found the
worker busy can await `wait_idle()` and try again instead of queueing behind it. Calls made through
`anyio.to_thread` (under trio) are not counted as running: there, as among those calls themselves,
the store's own locks keep calls apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread

__all__ = ('WorkerThread', 'WouldBlock', 'running_inline')

T = TypeVar('T')

logger = logging.getLogger(__name__)

_inline = threading.local()


def running_inline() -> bool:
    """Whether the current call runs inline (`WorkerThread.try_inline`) on the caller's thread."""
    return getattr(_inline, 'active', False)


class WouldBlock(Exception):
    """Raised by a call running inline that would have to wait: the caller runs it on the thread."""


class _State:
    """What a worker shares with its thread: how many calls are queued or running, and the gate
    held while one runs (on the thread or inline)."""

    __slots__ = ('gate', 'idle', 'lock', 'pending')

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gate = threading.Lock()
        self.pending = 0
        self.idle: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        """Tasks waiting for the thread to have no call queued or running (`WorkerThread.wait_idle`)."""


_Job = tuple[Callable[..., Any], tuple[Any, ...], 'asyncio.AbstractEventLoop | None', 'asyncio.Future[Any] | None']


class WorkerThread:
    """One daemon thread running submitted calls in submission order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._state = _State()
        self._lock = self._state.lock
        self._jobs: queue.SimpleQueue[_Job | None] | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the worker thread; its result or exception comes back to the caller."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return await anyio.to_thread.run_sync(fn, *args)
        future: asyncio.Future[T] = loop.create_future()
        self._queue().put((fn, args, loop, future))
        return await future

    def try_inline(self, fn: Callable[..., T], *args: Any) -> tuple[bool, T | None]:
        """`(True, fn(*args))` run now on the calling thread when the worker is idle; `(False, None)`
        when a call is queued or running (then use `run`), or when `fn` raised `WouldBlock`.

        Any other exception `fn` raises propagates.
        """
        state = self._state
        with state.lock:
            if state.pending or not state.gate.acquire(blocking=False):
                return False, None
        _inline.active = True
        try:
            return True, fn(*args)
        except WouldBlock:
            return False, None
        finally:
            _inline.active = False
            state.gate.release()

    async def wait_idle(self) -> bool:
        """Wait until no call is queued or running on the thread; `False` at once when none is."""
        state = self._state
        loop = asyncio.get_running_loop()
        with state.lock:
            if not state.pending:
                return False
            future: asyncio.Future[None] = loop.create_future()
            state.idle.append((loop, future))
        await future
        return True

    def enqueue(self, fn: Callable[[], object]) -> None:
        """Run `fn()` on the worker thread after every call queued so far, without waiting for it.

        An exception it raises is logged.
        """
        self._queue().put((fn, (), None, None))

    def close(self) -> None:
        """Let the thread finish the calls already queued, then stop."""
        with self._lock:
            jobs, self._jobs = self._jobs, None
        if jobs is not None:
            jobs.put(None)

    def _queue(self) -> queue.SimpleQueue[_Job | None]:
        """The thread's queue (started if need be), counting the call about to be put on it."""
        with self._lock:
            if self._jobs is None:
                jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
                threading.Thread(target=_serve, args=(jobs, self._state), name=self.name, daemon=True).start()
                # The thread holds only the queue and the state: a worker dropped without close()
                # still stops it.
                weakref.finalize(self, jobs.put, None)
                self._jobs = jobs
            self._state.pending += 1
            return self._jobs


def _serve(jobs: queue.SimpleQueue[_Job | None], state: _State) -> None:
    while (job := jobs.get()) is not None:
        fn, args, loop, future = job
        del job
        with state.gate:
            result, error = _run(fn, args, loop is None or future is None)
        with state.lock:
            state.pending -= 1
            idle, state.idle = (state.idle, []) if not state.pending else ([], state.idle)
        # the worker counts as idle before the caller resumes, so its next call may run inline
        if loop is not None and future is not None:
            _hand_back(loop, future, result, error)
        for waiting in idle:
            _hand_back(*waiting, None, None)
        del fn, args, loop, future, result, error  # hold nothing of a finished call while waiting


def _run(fn: Callable[..., Any], args: tuple[Any, ...], background: bool) -> tuple[Any, BaseException | None]:
    try:
        return fn(*args), None
    except BaseException as error:  # handed to the awaiting task, whatever it is
        if background:
            logger.exception('background call %r failed', fn)
            return None, None
        return None, error


def _hand_back(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any, error: BaseException | None
) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the awaiting task was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
