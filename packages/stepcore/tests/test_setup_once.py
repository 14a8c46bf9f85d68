"""`SetupOnce`: one run of a store's lazy setup, however many first calls arrive together."""

from __future__ import annotations

import asyncio

import pytest

from stepcore.backend_io.setup_once import SetupOnce


async def test_concurrent_first_calls_run_the_setup_once() -> None:
    runs: list[int] = []
    release = asyncio.Event()

    async def setup() -> None:
        runs.append(len(runs))
        await release.wait()

    once = SetupOnce(setup)
    callers = [asyncio.create_task(once()) for _ in range(5)]
    await asyncio.sleep(0)
    assert not once.done
    release.set()
    await asyncio.gather(*callers)
    assert runs == [0]
    assert once.done
    await once()
    assert runs == [0]


async def test_a_failed_setup_is_run_again_by_the_next_call() -> None:
    attempts: list[str] = []

    async def setup() -> None:
        attempts.append('try')
        if len(attempts) == 1:
            raise ConnectionError('server not reachable')

    once = SetupOnce(setup)
    with pytest.raises(ConnectionError, match='server not reachable'):
        await once()
    assert not once.done
    await once()
    assert once.done
    assert attempts == ['try', 'try']
