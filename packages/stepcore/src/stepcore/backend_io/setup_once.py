"""`SetupOnce`: a store's one-time setup (schema, indexes) run on first use, exactly once.

Backends create tables or indexes lazily, on their first call, because constructors cannot await.
Concurrent first calls must not run the setup twice, and a setup that fails must be tried again by
the next call rather than leave the store marked ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ('SetupOnce',)


class SetupOnce:
    """Await `setup()` on the first call; later calls return at once.

    Concurrent first callers wait on one lock, so `setup` runs a single time. If it raises, the
    error reaches the caller and the next call runs it again. The lock is created on first use, so
    the owner may be built outside a running event loop.
    """

    def __init__(self, setup: Callable[[], Awaitable[None]]) -> None:
        self._setup = setup
        self._done = False
        self._lock: asyncio.Lock | None = None

    @property
    def done(self) -> bool:
        """Whether the setup has completed."""
        return self._done

    async def __call__(self) -> None:
        if self._done:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._done:
                await self._setup()
                self._done = True
