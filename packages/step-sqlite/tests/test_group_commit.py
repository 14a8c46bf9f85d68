"""Writes of many runs waiting at once share one transaction; each is durable before it returns."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_sqlite import SqliteStepStore
from step_sqlite.store import SqlitePort
from stepcore import ContinuableSnapshot, EventKind, RunRecord, SnapshotState, StepEvent


def _count_transactions(store: SqliteStepStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the write transactions the store's port opens (how many runs each one covered)."""
    port = store.port
    assert isinstance(port, SqlitePort)
    opened: list[int] = []
    original = port.transaction

    @contextmanager
    def counted(runs: Sequence[str]) -> Iterator[Any]:
        opened.append(len(runs))
        with original(runs) as tx:
            yield tx

    monkeypatch.setattr(port, 'transaction', counted)
    return opened


def _snapshot(run_id: str, i: int) -> ContinuableSnapshot:
    return ContinuableSnapshot(
        run_id=run_id,
        step_index=1,
        state=SnapshotState.COMPLETE,
        messages=[
            ModelRequest(parts=[UserPromptPart(f'question {i}')]),
            ModelResponse(parts=[TextPart(f'answer {i}')]),
        ],
    )


async def test_concurrent_writes_of_many_runs_commit_together_and_are_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / 'runs.db'
    store = SqliteStepStore(database=path)
    await store.list_runs()
    opened = _count_transactions(store, monkeypatch)
    runs = [f'run-{i}' for i in range(20)]
    snapshots = [_snapshot(run_id, i) for i, run_id in enumerate(runs)]
    await asyncio.gather(*(store.register_run(RunRecord(run_id=run_id)) for run_id in runs))
    await asyncio.gather(
        *(
            store.write_batch(
                [StepEvent(run_id=run_id, kind=EventKind.RUN_STARTED, idempotency_key='start', step_index=0)],
                snapshot=snapshots[i],
            )
            for i, run_id in enumerate(runs)
        )
    )
    # 40 writes; far fewer transactions, some covering many runs
    assert len(opened) < 40
    assert max(opened) > 1
    # every write was committed before its call returned: another connection sees all of them
    other = SqliteStepStore(database=path)
    assert sorted(run.run_id for run in await other.list_runs()) == sorted(runs)
    for i, run_id in enumerate(runs):
        latest = await other.latest_snapshot(run_id)
        assert latest is not None
        assert latest.messages == snapshots[i].messages
        assert [event.kind for event in await other.list_events(run_id)] == [EventKind.RUN_STARTED]
    await other.aclose()
    await store.aclose()


async def test_a_failing_write_fails_alone_and_the_others_in_its_transaction_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / 'runs.db'
    store = SqliteStepStore(database=path)
    await store.register_run(RunRecord(run_id='taken'))
    opened = _count_transactions(store, monkeypatch)
    good = [f'good-{i}' for i in range(5)]
    outcomes = await asyncio.gather(
        *(store.register_run(RunRecord(run_id=run_id)) for run_id in good[:2]),
        store.register_run(RunRecord(run_id='taken')),  # a second registration of a stored run
        *(store.register_run(RunRecord(run_id=run_id)) for run_id in good[2:]),
        return_exceptions=True,
    )
    assert len(opened) == 1  # all six shared one transaction
    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert len(errors) == 1
    assert isinstance(errors[0], ValueError)
    assert "'taken'" in str(errors[0])
    await store.aclose()
    reopened = SqliteStepStore(database=path)
    assert sorted(run.run_id for run in await reopened.list_runs()) == sorted(['taken', *good])
    await reopened.aclose()


async def test_a_lone_write_takes_one_transaction_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStepStore(database=tmp_path / 'runs.db')
    await store.list_runs()
    opened = _count_transactions(store, monkeypatch)
    for i in range(3):
        await store.register_run(RunRecord(run_id=f'r{i}'))
    assert opened == [1, 1, 1]
    await store.aclose()


async def test_writes_queued_on_a_closed_store_fail_with_a_clear_error(tmp_path: Path) -> None:
    store = SqliteStepStore(database=tmp_path / 'runs.db')
    await store.list_runs()
    await store.aclose()
    with pytest.raises(RuntimeError, match='closed'):
        await asyncio.gather(*(store.register_run(RunRecord(run_id=f'r{i}')) for i in range(3)))


async def test_a_short_write_runs_on_the_event_loop_when_the_database_thread_is_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStepStore(database=tmp_path / 'runs.db')
    await store.register_run(RunRecord(run_id='r'))
    threads: list[str] = []
    port = store.port
    assert isinstance(port, SqlitePort)
    assert port.inline_writes
    original = port.write_step

    def write_step(tx: Any, op: Any) -> Any:
        threads.append(threading.current_thread().name)
        return original(tx, op)

    monkeypatch.setattr(port, 'write_step', write_step)
    await store.write_batch(
        [StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0)], snapshot=_snapshot('r', 1)
    )
    assert threads == [threading.current_thread().name]
    assert [e.kind for e in await store.list_events('r')] == [EventKind.RUN_STARTED]
    await store.aclose()


async def test_a_write_waiting_for_another_connections_lock_leaves_the_event_loop_free(tmp_path: Path) -> None:
    path = tmp_path / 'runs.db'
    store = SqliteStepStore(database=path, timeout=10)
    await store.register_run(RunRecord(run_id='r'))
    other = sqlite3.connect(path, isolation_level=None)
    other.execute('BEGIN IMMEDIATE')  # another writer holds the database's write lock
    write = asyncio.ensure_future(store.append_event(StepEvent(run_id='r', kind=EventKind.RUN_STARTED, step_index=0)))
    await asyncio.sleep(0.1)
    # still waiting, on the database's thread: had it waited on the event loop it would have run out its
    # timeout (blocking this task) and failed
    assert not write.done()
    other.execute('COMMIT')
    await asyncio.wait_for(write, 10)
    assert [e.kind for e in await store.list_events('r')] == [EventKind.RUN_STARTED]
    other.close()
    await store.aclose()


async def test_synchronous_full_keeps_writes_on_the_database_thread(tmp_path: Path) -> None:
    store = SqliteStepStore(database=tmp_path / 'runs.db', synchronous='FULL')
    port = store.port
    assert isinstance(port, SqlitePort)
    assert not port.inline_writes  # each commit waits for the disk
    await store.aclose()


async def test_after_writes_on_the_event_loop_a_write_on_the_database_thread_waits_for_the_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / 'runs.db'
    store = SqliteStepStore(database=path, timeout=10)
    for i in range(3):  # inline writes: the busy timeout is left off between them
        await store.register_run(RunRecord(run_id=f'r{i}'))
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute('BEGIN IMMEDIATE')
    threading.Timer(0.3, lambda: other.execute('COMMIT')).start()
    # the write cannot begin on the event loop; on the database's thread it waits out the other
    # writer (the busy timeout is back on there), it does not fail with "database is locked"
    await store.write_batch(
        [StepEvent(run_id='r0', kind=EventKind.RUN_STARTED, step_index=0)], snapshot=_snapshot('r0', 1)
    )
    assert [e.kind for e in await store.list_events('r0')] == [EventKind.RUN_STARTED]
    other.close()
    await store.aclose()
