"""One connection pool, opened lazily, shared by a step store and its default media store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from .schema import redact_dsn

__all__ = ('PoolHandle',)

DEFAULT_MAX_POOL_SIZE = 10
CONNECT_TIMEOUT_SECONDS = 30.0


class PoolHandle:
    """Either a pool the caller gave (never opened or closed here) or one built from a DSN.

    A pool built here is opened on first use, from inside the running event loop, and closed by
    `close()`.
    """

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any] | None,
        dsn: str | None,
        owner: str,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    ) -> None:
        if (pool is None) == (dsn is None):
            raise ValueError(
                f'{owner} needs exactly one of pool= (an AsyncConnectionPool you manage) or dsn= '
                f'(a connection string; the store then owns its pool), got pool={pool!r}, '
                f'dsn={redact_dsn(dsn) if dsn is not None else None!r}'
            )
        if dsn is not None and not isinstance(cast(object, dsn), str):
            raise ValueError(f'{owner}: dsn must be a connection string, got {type(dsn).__name__}')
        if (
            isinstance(connect_timeout, bool)
            or not isinstance(cast(object, connect_timeout), int | float)
            or connect_timeout <= 0
        ):
            raise ValueError(f'{owner}: connect_timeout={connect_timeout!r} must be a positive number of seconds')
        self.connect_timeout = float(connect_timeout)
        self.owned = pool is None
        self.dsn = dsn
        self._pool = pool
        self._opened = False
        self._lock: asyncio.Lock | None = None

    @property
    def pool(self) -> AsyncConnectionPool[Any] | None:
        """The pool in use, `None` while a DSN-built pool has not been opened yet."""
        return self._pool

    async def get(self) -> AsyncConnectionPool[Any]:
        if self._pool is not None and (not self.owned or self._opened):
            if self._pool.closed:
                raise RuntimeError(
                    f'the connection pool {self._pool.name!r} given as pool= is not open: open it first '
                    '(`await pool.open()` or `async with AsyncConnectionPool(...) as pool:`), and close it '
                    'only after the store is done'
                )
            return self._pool
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._pool is None or not self._opened:
                assert self.dsn is not None
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    self.dsn,
                    # Autocommit: a read or a one-statement write is one round trip; writes of
                    # several statements open their own transaction.
                    kwargs={'autocommit': True},
                    min_size=1,
                    max_size=DEFAULT_MAX_POOL_SIZE,
                    open=False,
                    name='step-postgres',
                )
                try:
                    await pool.open(wait=True, timeout=self.connect_timeout)
                except PoolTimeout as exc:
                    await pool.close()
                    raise ConnectionError(
                        f'could not connect to PostgreSQL at {redact_dsn(self.dsn)} within '
                        f'{self.connect_timeout:g} s: check that the server is running and the DSN is right'
                    ) from exc
                self._pool = pool
                self._opened = True
            return self._pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        pool = await self.get()
        async with pool.connection() as conn:
            yield conn

    async def close(self) -> None:
        """Close the pool if it was built here; a given pool is left to its owner."""
        if self.owned and self._pool is not None:
            pool, self._pool, self._opened = self._pool, None, False
            await pool.close()
