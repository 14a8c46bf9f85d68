"""Running a command's coroutine without touching the caller's current event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar('T')


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on a private event loop.

    Like `asyncio.run`, but it never installs its loop as the thread's current one (nor resets it
    to `None` afterwards), so calling a command from code or tests that already have an event loop
    set leaves that loop exactly as it was.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
