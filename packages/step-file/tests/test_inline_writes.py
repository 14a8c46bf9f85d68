"""Short writes run on the event loop when the store's thread is idle, and never wait there."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from step_file import FileStepStore
from step_file.layout import LOCK_FILE
from step_file.store import FilePort
from stepcore import EventKind, RunRecord, StepEvent


async def test_a_short_write_runs_on_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStepStore(directory=tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    port = store.port
    assert isinstance(port, FilePort)
    assert port.inline_writes
    threads = _threads_writing_events(port, monkeypatch)
    await store.append_event(StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0))
    assert threads == [threading.current_thread().name]
    await store.aclose()


async def test_a_short_write_finding_the_thread_busy_waits_for_it_then_runs_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStepStore(directory=tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    port = store.port
    assert isinstance(port, FilePort)
    assert port.worker is not None
    threads = _threads_writing_events(port, monkeypatch)
    started, release = threading.Event(), threading.Event()

    def busy() -> None:
        started.set()
        release.wait(5)

    busy_call = asyncio.ensure_future(port.worker.run(busy))
    await asyncio.to_thread(started.wait, 5)
    write = asyncio.ensure_future(store.append_event(StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0)))
    await asyncio.sleep(0.05)
    assert not write.done()  # the thread is still busy
    release.set()
    await asyncio.gather(busy_call, write)
    assert threads == [threading.current_thread().name]
    assert [e.kind for e in await store.list_events('r')] == [EventKind.RUN_STARTED]
    await store.aclose()


async def test_a_write_to_a_run_locked_by_another_process_leaves_the_event_loop_free(tmp_path: Path) -> None:
    store = FileStepStore(directory=tmp_path)
    await store.register_run(RunRecord(run_id='r'))
    await store.append_event(StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0))
    # another open file description holds the run's lock, as another process's writer would
    fd = os.open(tmp_path / 'r' / LOCK_FILE, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    write = asyncio.ensure_future(store.append_event(StepEvent(run_id='r', kind=EventKind.RUN_COMPLETED, step_index=0)))
    await asyncio.sleep(0.1)
    # still waiting, on the store's thread: had it waited on the event loop, this task would not
    # have run again before the lock was released
    assert not write.done()
    os.close(fd)  # releases the lock
    await asyncio.wait_for(write, 10)
    kinds = [e.kind for e in await store.list_events('r')]
    assert kinds == [EventKind.RUN_STARTED, EventKind.RUN_COMPLETED]  # written once, in order
    await store.aclose()


async def test_full_durability_keeps_writes_on_the_store_thread(tmp_path: Path) -> None:
    store = FileStepStore(directory=tmp_path, durability='full')
    port = store.port
    assert isinstance(port, FilePort)
    assert not port.inline_writes  # every append is fsynced
    await store.aclose()


def _threads_writing_events(port: FilePort, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads the port's `put_events` runs on, call by call."""
    threads: list[str] = []
    original = port.put_events

    def put_events(tx: Any, op: Any) -> None:
        threads.append(threading.current_thread().name)
        original(tx, op)

    monkeypatch.setattr(port, 'put_events', put_events)
    return threads
