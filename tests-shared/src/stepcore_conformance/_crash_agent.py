"""The agent run of the SIGKILL crash test (see `crash_window` and `_crash_zygote`).

One tool cycle of two parallel calls (`fast`, and `slow`, which is still running when the fast
one's end is written), then a final answer, with a fault hook that SIGKILLs the process at its
`k`-th write boundary.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart

import stepcore
from stepcore import InMemoryStepStore, StepPersistence
from stepcore.backend import ENGINE_PORT, inject_faults

from ._declared import declared
from .capability import function_model, script, tool_call

__all__ = ('FINAL_ANSWER', 'SLOW_SECONDS', 'TOOL_CALLS', 'agent_run')

SLOW_SECONDS = 0.05
"""How long the slow tool takes: the fast call's end is written while the slow one still runs."""
TOOL_CALLS = ('fast-1', 'slow-1')
FINAL_ANSWER = 'both looked up'


async def agent_run(spec: dict[str, Any] | None, k: int, run_id: str) -> None:
    """Run the agent on a store built from `spec` (in memory: `None`), killing this process at write boundary `k`."""
    store = stepcore.from_spec(**spec) if spec is not None else InMemoryStepStore()
    if ENGINE_PORT not in declared(store):
        raise TypeError(f'{type(store).__name__} does not declare feature {ENGINE_PORT!r}: it has no write boundaries')
    seen = 0

    def hook(boundary: str) -> None:
        nonlocal seen
        if seen == k:
            os.kill(os.getpid(), signal.SIGKILL)
        seen += 1

    agent = Agent(
        function_model(
            script(
                ModelResponse(
                    parts=[tool_call('fast', TOOL_CALLS[0], key='a'), tool_call('slow', TOOL_CALLS[1], key='b')]
                ),
                ModelResponse(parts=[TextPart(FINAL_ANSWER)]),
            )
        ),
        capabilities=[StepPersistence(store=store, run_id=run_id)],
    )

    @agent.tool_plain
    async def fast(key: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return key.upper()

    @agent.tool_plain
    async def slow(key: str) -> str:  # pyright: ignore[reportUnusedFunction]
        await asyncio.sleep(SLOW_SECONDS)
        return key.upper() * 2

    try:
        with inject_faults(store, hook):
            await agent.run('look up a and b')
    finally:
        await store.aclose()
