"""Fault injection at the engine's write boundaries, for crash tests.

Every write the engine makes goes through named boundaries: before each write operation (its
name, e.g. `put_snapshot`), before the commit (`commit`) and after it (`committed`); a port may add
its own inside an operation (the file store's `put_snapshot:nodes`, say). A hook installed with
`inject_faults` is called at each one and may raise (the write stops there, as if the process died:
a transaction is rolled back, writes already made without one stay) or kill the process.

`boundaries` runs a write once with a recording hook and returns the boundaries it passed, so a
test can then stop the same write at each of them in turn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from stepcore.engine._engine_store import EngineStore

__all__ = ('InjectedFault', 'boundaries', 'inject_faults', 'stop_at')


class InjectedFault(Exception):
    """Raised by `stop_at` at the chosen boundary."""


@contextmanager
def inject_faults(store: EngineStore, hook: Callable[[str], None]) -> Iterator[None]:
    """Call `hook(boundary)` at every write boundary of `store` inside the block."""
    port = store.port
    previous = port.fault_hook
    port.fault_hook = hook
    try:
        yield
    finally:
        port.fault_hook = previous


def stop_at(index: int) -> Callable[[str], None]:
    """A hook raising `InjectedFault` at the `index`-th boundary it sees (0-based), once."""
    seen = 0

    def hook(boundary: str) -> None:
        nonlocal seen
        seen += 1
        if seen - 1 == index:
            raise InjectedFault(f'stopped at boundary {index} ({boundary})')

    return hook


async def boundaries(store: EngineStore, write: Callable[[], Awaitable[Any]]) -> list[str]:
    """The boundaries `write()` passes on `store`, in order."""
    passed: list[str] = []
    with inject_faults(store, passed.append):
        await write()
    return passed
