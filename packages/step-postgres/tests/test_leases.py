"""Leases in PostgreSQL: the server's clock, the locks a swap and a fence take, and what a fence costs.

The behaviour every store shares (claims, fencing, renewal, orphans) is the kit's leases section
(`test_conformance.py`); these are the PostgreSQL mechanisms behind it.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors, pq, sql
from psycopg_pool import AsyncConnectionPool
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_postgres import PostgresStepStore
from step_postgres.schema import Tables
from step_postgres.store import PostgresPort
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent
from stepcore.engine import _ops as ops
from stepcore.engine._plans import Fenced
from stepcore.ownership import open_lease
from stepcore.store.leases import Fence, LeaseState, RunFencedError, fencing


@pytest.fixture
async def store(postgres_url: str, table_prefix: str) -> AsyncIterator[PostgresStepStore]:
    s = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix)
    yield s
    await s.aclose()


def _port(store: PostgresStepStore) -> PostgresPort:
    port = store.port
    assert isinstance(port, PostgresPort)
    return port


async def _server_clock(url: str) -> float:
    """The server's clock now, in seconds since the Unix epoch."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute('SELECT extract(epoch FROM clock_timestamp())::float8')
        row = await cur.fetchone()
        assert row is not None
        return float(row[0])


def _event(run_id: str, n: int) -> StepEvent:
    return StepEvent(run_id=run_id, kind=EventKind.MODEL_REQUEST_STARTED, step_index=n)


async def test_every_time_is_the_servers_clock(
    store: PostgresStepStore, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client clock a day ahead: a port that read it would store and answer times a day off.
    real = time.time
    monkeypatch.setattr(time, 'time', lambda: real() + 86_400)
    await store.register_run(RunRecord(run_id='r'))
    before = await _server_clock(postgres_url)
    opened = await open_lease(store, 'r', ttl=60.0)
    after = await _server_clock(postgres_url)
    assert before <= opened.checked_at.timestamp() <= after
    assert opened.seconds_left == pytest.approx(60.0, abs=1e-3)
    read = await store.get_lease('r')
    assert read is not None
    assert before <= read.checked_at.timestamp() <= await _server_clock(postgres_url)
    assert read.expires_at == opened.expires_at
    assert not read.expired
    (listed,) = await store.list_leases([LeaseState.RUNNING])
    assert before <= listed.checked_at.timestamp() <= await _server_clock(postgres_url)


async def test_a_swap_reads_the_clock_once_it_holds_the_lease(
    store: PostgresStepStore, postgres_url: str, table_prefix: str
) -> None:
    """Not `now()`, the time the swap's transaction began: a swap that waited for the lease row
    (another transaction held it) sets `expires` from when it got it, so the time to live it
    answers is the time the lease really has."""
    await store.register_run(RunRecord(run_id='r'))
    lease = await open_lease(store, 'r', ttl=60.0)
    async with await psycopg.AsyncConnection.connect(postgres_url) as holder:
        await holder.execute(
            Tables(table_prefix).query('SELECT FROM {run_leases} WHERE run_id = %s FOR UPDATE'), ('r',)
        )
        renewal = asyncio.create_task(store.swap_lease(replace(lease), expect=lease.epoch, ttl=60.0))
        await asyncio.sleep(0.5)
        assert not renewal.done(), 'the swap did not wait for the lease row'
        cur = await holder.execute('SELECT extract(epoch FROM clock_timestamp())::float8')
        row = await cur.fetchone()
        assert row is not None
        released = float(row[0])
        await holder.commit()
    swapped, now = await renewal
    assert swapped
    assert now is not None
    assert now.checked_at.timestamp() >= released
    assert now.seconds_left == pytest.approx(60.0, abs=1e-3)


async def test_the_fence_holds_the_lease_row_until_the_write_commits(
    store: PostgresStepStore, postgres_url: str, table_prefix: str
) -> None:
    """Even against a writer that takes no advisory lock: a takeover's `UPDATE` of the lease waits
    for a fenced write's transaction, and the write holds the lease at the epoch it checked."""
    await store.register_run(RunRecord(run_id='r'))
    lease = await open_lease(store, 'r', ttl=60.0)
    port = _port(store)
    takeover = Tables(table_prefix).query('UPDATE {run_leases} SET epoch = epoch + 1 WHERE run_id = %s')
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as other:
        await other.execute("SET lock_timeout = '200ms'")
        async with port.transaction(['r']) as tx:
            await port.check_lease(tx, ops.CheckLease('r', lease.epoch))
            await port.fetch(tx, port.ask_get_lease(ops.GetLease('r')))  # the check has run
            with pytest.raises(errors.LockNotAvailable):
                await other.execute(takeover, ('r',))
        await other.execute(takeover, ('r',))  # committed: the lease is free to move on
    after = await store.get_lease('r')
    assert after is not None
    assert after.epoch == lease.epoch + 1


async def test_a_fenced_transaction_names_the_run_that_lost_its_lease(store: PostgresStepStore) -> None:
    for run_id in ('a', 'b', 'c'):
        await store.register_run(RunRecord(run_id=run_id))
    held = await open_lease(store, 'a', ttl=60.0)
    lost = await open_lease(store, 'b', ttl=60.0)
    swapped, _ = await store.swap_lease(replace(lost, epoch=lost.epoch + 1), expect=lost.epoch, ttl=60.0)
    assert swapped
    port = _port(store)
    checks = [
        ([('a', held.epoch), ('b', lost.epoch)], 'b'),  # the second of two: found by reading the epochs
        ([('b', lost.epoch)], 'b'),
        ([('c', 1)], 'c'),  # no lease at all
    ]

    async def check(checked: list[tuple[str, int]]) -> None:
        async with port.transaction([run_id for run_id, _ in checked]) as tx:
            for run_id, epoch in checked:
                await port.check_lease(tx, ops.CheckLease(run_id, epoch))

    for checked, fenced in checks:
        with pytest.raises(Fenced) as refused:
            await check(checked)
        assert refused.value.run_id == fenced
    await check([('a', held.epoch)])
    async with port.reading('a') as conn:
        with pytest.raises(RuntimeError, match='only inside a write transaction'):
            await port.check_lease(conn, ops.CheckLease('a', held.epoch))


async def test_a_refused_write_leaves_nothing_and_the_connection_usable(postgres_url: str, table_prefix: str) -> None:
    """One connection in the pool: after a fenced write was refused (its transaction failed on the
    server), the next write on that very connection goes through."""
    async with AsyncConnectionPool(postgres_url, kwargs={'autocommit': True}, min_size=1, max_size=1) as pool:
        store = PostgresStepStore(pool=pool, table_prefix=table_prefix)
        await store.register_run(RunRecord(run_id='r'))
        first = await open_lease(store, 'r', ttl=60.0)
        swapped, _ = await store.swap_lease(replace(first, epoch=2), expect=first.epoch, ttl=60.0)
        assert swapped
        messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
        with fencing(Fence('r', first.epoch)), pytest.raises(RunFencedError, match='taken over'):
            await store.write_batch(
                [_event('r', 1)], snapshot=ContinuableSnapshot(run_id='r', messages=messages, step_index=1)
            )
        with fencing(Fence('r', 2)):
            await store.append_event(_event('r', 2))
        assert [e.step_index for e in await store.list_events('r')] == [2]
        assert await store.list_snapshots('r', include_interrupted=True) == []
        await store.aclose()
        async with pool.connection() as conn:
            assert conn.info.transaction_status == pq.TransactionStatus.IDLE


class _ProtocolTrace:
    """libpq's protocol trace of a pool's connections (`configure`), and the round trips in it so
    far: each time the client's messages (`F`) are followed by the server's (`B`), the client
    waited for an answer. (Counting `Sync` and `Flush` messages would not do: psycopg asks for a
    pipeline's answers with a `Flush`, and sends one behind the `Sync` that ends a pipeline.)"""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open('w')

    def close(self) -> None:
        self.file.close()

    def _start(self, conn: psycopg.AsyncConnection[Any]) -> None:
        conn.pgconn.trace(self.file.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    async def configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._start(conn)

    def _count(self) -> int:
        sides = [line[:1] for line in self.path.read_text().splitlines()]
        return sum(1 for sent, then in itertools.pairwise(sides) if (sent, then) == ('F', 'B'))

    async def round_trips(self, pool: AsyncConnectionPool[Any]) -> int:
        """Between the store's calls: its only connection, idle, is taken from the pool and traced
        anew, since libpq buffers the trace and writes it out when it stops tracing."""
        async with pool.connection() as conn:
            conn.pgconn.untrace()
            count = self._count()
            self._start(conn)
        return count


@contextmanager
def _protocol_trace() -> Iterator[_ProtocolTrace]:
    with tempfile.TemporaryDirectory() as tmp:
        trace = _ProtocolTrace(Path(tmp, 'trace'))
        try:
            yield trace
        finally:
            trace.close()


async def _round_trips(postgres_url: str, table_prefix: str, *, fenced: bool) -> list[int]:
    """The round trips of each of three steps of one run (an event, then a snapshot save with an
    idempotency key, whose check is read first), with or without a fence, on the store's only
    connection."""
    with _protocol_trace() as trace:
        async with AsyncConnectionPool(
            postgres_url, kwargs={'autocommit': True}, min_size=1, max_size=1, configure=trace.configure
        ) as pool:
            store = PostgresStepStore(pool=pool, table_prefix=table_prefix)
            await store.register_run(RunRecord(run_id='r'))
            lease = await open_lease(store, 'r', ttl=60.0)
            messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
            counts: list[int] = []
            for step in range(3):
                messages = [*messages, ModelResponse(parts=[TextPart(f'step {step}')])]
                snapshot = ContinuableSnapshot(
                    run_id='r', messages=messages, step_index=step, idempotency_key=f'{step}'
                )
                before = await trace.round_trips(pool)
                with fencing(Fence('r', lease.epoch)) if fenced else nullcontext():
                    await store.append_event(_event('r', step))
                    await store.save_snapshot(snapshot)
                counts.append(await trace.round_trips(pool) - before)
            await store.aclose()
    return counts


async def test_a_fenced_write_costs_no_round_trip_more(postgres_url: str, new_prefix: Callable[[], str]) -> None:
    plain = await _round_trips(postgres_url, new_prefix(), fenced=False)
    fenced = await _round_trips(postgres_url, new_prefix(), fenced=True)
    assert fenced == plain, (plain, fenced)
    assert plain[1:] == [3, 3], plain  # one for the event; the save's check, then its writes and commit


async def test_live_leases_are_listed_through_the_index_of_states(store: PostgresStepStore, postgres_url: str) -> None:
    await store.register_run(RunRecord(run_id='r'))  # the tables are there
    query = _port(store)._q.leases_list
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute('SET enable_seqscan = off')
        cur = await conn.execute(sql.SQL('EXPLAIN ') + query, (['running', 'pending'],))
        plan = '\n'.join(str(row[0]) for row in await cur.fetchall())
    assert store.tables.name('run_leases_state') in plan, plan
