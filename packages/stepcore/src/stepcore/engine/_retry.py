"""Passing store failures made again: one schedule of waits, used by the driver and by ports.

A store's read or write can fail for a reason that passes: a timeout, a dropped connection, a
failover, a transaction that conflicted with another. The port says which of its errors those are
(`Port.transient`); the driver then makes the same read, or the same write transaction whole, again
after a wait that grows with each failure and is random within it, so that writers that failed
together start apart and a store under contention still moves forward. Past `RETRY_SECONDS` the
last error ends the call, with a note saying how often it was tried.

A write is made again only when its failure is known to have stored nothing: a conflict or a
deadlock, a lock not granted; a connection lost while the commit was on its way is not one, unless
the port makes its commit idempotent (the Redis port does, by a write id its commit script records).
A write fenced meanwhile (its lease taken over) fails its check on the next attempt and stops
there: retries never outlive the lease they write under.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

__all__ = ('FIRST_WAIT', 'MOST_WAIT', 'RETRY_SECONDS', 'backoff', 'retrying')

T = TypeVar('T')

RETRY_SECONDS: Final = 30.0
"""How long a read or a write keeps being made again after passing failures."""
FIRST_WAIT: Final = 0.005
MOST_WAIT: Final = 1.0
"""The wait after the n-th failure is random between 0 and `FIRST_WAIT` * 2**n, at most `MOST_WAIT`."""


def backoff(failures: int, *, first: float = FIRST_WAIT, most: float = MOST_WAIT) -> float:
    """Seconds to wait after the `failures`-th failure in a row: random within a bound that doubles
    with each failure ("full jitter")."""
    return random.uniform(0.0, min(most, first * 2 ** min(failures, 32)))


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    transient: Callable[[Exception], bool],
    *,
    seconds: float | None = None,
    failed: int = 0,
) -> T:
    """`await attempt()`, made again after each failure `transient` accepts, for up to `seconds`
    (`None`: `RETRY_SECONDS`). `failed`: how often the caller's own first attempts failed so (it
    tried once at no cost before it called this): the first attempt here waits as after those."""
    if seconds is None:
        seconds = RETRY_SECONDS
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    failures = failed
    if failures:
        await asyncio.sleep(backoff(failures))
    while True:
        try:
            return await attempt()
        except Exception as error:
            if not transient(error):
                raise
            failures += 1
            if loop.time() >= deadline:
                error.add_note(f'tried {failures} times over {seconds:g} s; the failure did not pass')
                raise
            await asyncio.sleep(backoff(failures))
