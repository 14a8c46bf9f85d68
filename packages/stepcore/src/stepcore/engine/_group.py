"""Group commit: the writes that wait while a transaction runs share the next one.

When several runs write to one store at once, each write used to take a transaction (and a
commit) of its own, one after the other on the port's thread. With a port that can isolate one
write inside a transaction (`SyncPort.group_commit`, a savepoint per write), the engine queues
writes instead: the first starts a flush on the port's thread, and every write queued before that
flush starts is carried out in one transaction and committed once. Writes arriving meanwhile
wait for the next flush, so a lone write is not delayed and a busy store commits many runs'
writes at a time.

Nothing about durability changes: a write's caller is answered only after the commit that made
it durable. A write that fails (a conflicting key, a stale history, bad input) is rolled back to
its savepoint and fails alone; the others commit. A failed commit fails every write in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from stepcore.engine._port import SyncPort

__all__ = ('NOT_PREPARED', 'WriteGroups')

T = TypeVar('T')


class _NotPrepared:
    """What a write answers when its `prepare()` returned `False` (it did not run)."""


NOT_PREPARED = _NotPrepared()


@dataclass(slots=True)
class _Write(Generic[T]):
    runs: Sequence[str]
    prepare: Callable[[], bool] | None
    body: Callable[[Any], T]
    """Carries out the write inside the open transaction (given as its argument)."""
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = None
    carried: bool = False
    """Whether `result` or `error` holds the outcome."""


@dataclass(slots=True)
class _Flush:
    ran: bool = False
    writes: list[_Write[Any]] = field(default_factory=list[_Write[Any]])


class WriteGroups:
    """Queues writes to one `SyncPort` and commits those waiting together (see the module docstring)."""

    def __init__(self, port: SyncPort) -> None:
        self._port = port
        self._lock = threading.Lock()
        self._pending: list[_Write[Any]] = []
        self._flush: _Flush | None = None  # the flush queued and not yet started

    async def write(self, runs: Sequence[str], prepare: Callable[[], bool] | None, body: Callable[[Any], T]) -> Any:
        """Run `prepare()` then, unless it returned `False` (answer: `NOT_PREPARED`), `body(tx)` in
        a transaction shared with the writes queued alongside; return what `body` returned."""
        loop = asyncio.get_running_loop()
        write = _Write(runs, prepare, body, loop, loop.create_future())
        with self._lock:
            self._pending.append(write)
            flush = self._flush
            start = flush is None
            if flush is None:
                flush = self._flush = _Flush()
        if start:
            task = asyncio.ensure_future(self._port.call(self._run, flush))
            task.add_done_callback(lambda done: self._answer(flush, done))
        return await write.future

    def _run(self, flush: _Flush) -> None:
        """On the port's thread: take every write queued so far and carry them out together."""
        with self._lock:
            flush.ran = True
            flush.writes, self._pending = self._pending, []
            self._flush = None
        self._carry_out(flush.writes)

    def _carry_out(self, writes: list[_Write[Any]]) -> None:
        port = self._port
        ready: list[_Write[Any]] = []
        for write in writes:
            try:
                if write.prepare is not None and not write.prepare():
                    write.result, write.carried = NOT_PREPARED, True
                    continue
            except Exception as error:
                write.error, write.carried = error, True
                continue
            ready.append(write)
        if not ready:
            return
        runs = list(dict.fromkeys(run for write in ready for run in write.runs))
        try:
            with port.transaction(runs) as tx:
                if len(ready) == 1:
                    ready[0].result = ready[0].body(tx)
                else:
                    for write in ready:
                        try:
                            with port.savepoint(tx):
                                write.result = write.body(tx)
                        except Exception as error:
                            write.error, write.carried = error, True
                port.boundary('commit')
            port.boundary('committed')
        except BaseException as error:
            for write in ready:
                if write.error is None:
                    write.result, write.error = None, error
                write.carried = True
            if not isinstance(error, Exception):
                raise
        for write in ready:
            write.carried = True

    def _answer(self, flush: _Flush, done: asyncio.Future[None]) -> None:
        """On the event loop, once the port's call is over (and anything it queued behind itself is
        queued): answer every write of the flush. A flush whose hand-off failed before it started
        (a closed store) fails the writes it would have taken."""
        error = asyncio.CancelledError() if done.cancelled() else done.exception()
        if not flush.ran:
            with self._lock:
                if not flush.ran:
                    flush.ran = True
                    flush.writes, self._pending = self._pending, []
                    self._flush = None
        for write in flush.writes:
            if not write.carried:
                write.error = error or RuntimeError('the write was not carried out')
        _answer(flush.writes)


def _answer(writes: list[_Write[Any]]) -> None:
    """Hand each write's outcome back to the event loop that waits for it (one hand-off per loop)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Write[Any]]] = {}
    for write in writes:
        by_loop.setdefault(write.loop, []).append(write)
    for loop, batch in by_loop.items():
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            _settle(batch)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, batch)


def _settle(writes: list[_Write[Any]]) -> None:
    for write in writes:
        if write.future.done():  # the waiting task was cancelled; the write stands
            continue
        if isinstance(write.error, asyncio.CancelledError):
            write.future.cancel()
        elif write.error is not None:
            write.future.set_exception(write.error)
        else:
            write.future.set_result(write.result)
