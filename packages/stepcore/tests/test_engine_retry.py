"""Passing store failures are made again by the engine, for every store: the port names them."""

from __future__ import annotations

from typing import Any

import pytest

from stepcore import InMemoryStepStore
from stepcore.engine import _ops as ops
from stepcore.engine import _retry
from stepcore.engine.memory import MemoryPort
from stepcore_conformance.support import check_tool_steps, write_tool_steps


class Blip(Exception):
    """A failure that passes (a timeout, a conflict)."""


class BlinkingPort(MemoryPort):
    """A memory port whose event writes and run reads fail `fail` times before they succeed."""

    def __init__(self, fail: int, error: type[Exception] = Blip) -> None:
        super().__init__()
        self.fail = fail
        self.error = error
        self.failed = 0

    def _blink(self) -> None:
        if self.failed < self.fail:
            self.failed += 1
            raise self.error('the store blinked')

    def put_events(self, tx: Any, op: ops.PutEvents) -> None:
        self._blink()
        super().put_events(tx, op)

    def get_run(self, tx: Any, op: ops.GetRun) -> ops.RunRow | None:
        self._blink()
        return super().get_run(tx, op)

    def list_runs(self, tx: Any, op: ops.ListRuns) -> Any:
        self._blink()
        return super().list_runs(tx, op)

    def transient(self, error: Exception, *, write: bool) -> bool:
        return isinstance(error, Blip)


def _store(port: MemoryPort) -> InMemoryStepStore:
    store = InMemoryStepStore()
    store.port = port
    return store


async def test_a_write_that_fails_in_passing_is_made_again_whole() -> None:
    port = BlinkingPort(fail=0)
    store = _store(port)
    await write_tool_steps(store, 'run', steps=1)
    port.fail = port.failed + 3
    await write_tool_steps(store, 'run-2', steps=2)
    assert port.failed == 3
    await check_tool_steps(store, 'run-2', steps=2)


async def test_a_read_that_fails_in_passing_is_made_again() -> None:
    port = BlinkingPort(fail=0)
    store = _store(port)
    await write_tool_steps(store, 'run', steps=1)
    port.fail = port.failed + 2
    assert await store.get_run(run_id='run') is not None
    assert port.failed == 2


async def test_a_failure_the_port_does_not_call_passing_is_raised_at_once() -> None:
    port = BlinkingPort(fail=0, error=OSError)
    store = _store(port)
    await write_tool_steps(store, 'run', steps=1)
    port.fail = port.failed + 1
    with pytest.raises(OSError, match='blinked'):
        await write_tool_steps(store, 'run-2', steps=1)
    assert port.failed == 1


async def test_a_failure_that_does_not_pass_ends_the_call_naming_the_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_retry, 'RETRY_SECONDS', 0.2)
    port = BlinkingPort(fail=0)
    store = _store(port)
    await write_tool_steps(store, 'run', steps=1)
    port.fail = 10**9
    with pytest.raises(Blip) as raised:
        await store.get_run(run_id='run')
    assert port.failed > 2
    assert any('the failure did not pass' in note for note in raised.value.__notes__)


def test_waits_grow_with_failures_and_stay_random_within_their_bound() -> None:
    for failures in range(1, 12):
        bound = min(_retry.MOST_WAIT, _retry.FIRST_WAIT * 2**failures)
        waits = [_retry.backoff(failures) for _ in range(200)]
        assert all(0.0 <= wait <= bound for wait in waits)
        assert len(set(waits)) > 100
    assert max(_retry.backoff(40) for _ in range(200)) > _retry.MOST_WAIT / 2


async def test_a_store_that_never_answered_is_not_tried_again() -> None:
    """A wrong address or a server that is down fails at once, not after a minute of tries."""
    port = BlinkingPort(fail=1)
    store = _store(port)
    with pytest.raises(Blip):
        await store.list_runs()
    assert port.failed == 1
    assert await store.list_runs() == []
