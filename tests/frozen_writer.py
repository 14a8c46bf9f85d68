"""A worker that freezes inside one of its own PostgreSQL write transactions.

`python frozen_writer.py '<config json>'` runs a two-step agent on the PostgreSQL store with a short
lease. When the second step's records are written, the process stops itself (SIGSTOP) in the
middle of that write's transaction, after its statements went to the server and before its commit:
the run's advisory lock and its lease row stay held by a session whose process does nothing. It
writes `<run id>.frozen` in the world directory first, so the test knows. After SIGCONT it goes
on; whatever its run raises is written to `<run id>.outcome`. With `"action": "kill"` it SIGKILLs
itself there instead: its run is an orphan whose last write never committed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import stepcore
from step_postgres.store import PostgresPort
from stepcore import StepPersistence, StepStore, recovery_policy
from stepcore.backend import ops


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
    if done >= 2:
        return ModelResponse(parts=[TextPart('done')])
    return ModelResponse(parts=[ToolCallPart('step', {'n': done + 1}, tool_call_id=f'step-{done + 1}')])


def build_agent(store: StepStore, *, run_id: str | None = None, ttl: float = 1.0) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(model), name='frozen', capabilities=[StepPersistence(store=store, run_id=run_id, lease_ttl=ttl)]
    )

    @agent.tool_plain
    @recovery_policy('rerun')
    def step(n: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'step {n} done'

    return agent


def freeze_in_second_write(world: Path, run_id: str, action: str) -> None:
    """Stop this process (`action` 'stop'; 'kill': end it) inside the transaction that records the
    second step's ledger entry."""
    send_effects = PostgresPort._send_effects  # pyright: ignore[reportPrivateUsage]  # a step's or a batch's ledger rows

    async def frozen(self: PostgresPort, tx: Any, rows: Sequence[ops.EffectRow]) -> None:
        await send_effects(self, tx, rows)
        if any(row.run_id == run_id and row.tool_call_id == 'step-2' for row in rows):
            (world / f'{run_id}.frozen').write_text(str(os.getpid()))
            await (await tx.execute('SELECT 1')).fetchone()  # all sent and done on the server: the locks are held
            os.kill(os.getpid(), signal.SIGSTOP if action == 'stop' else signal.SIGKILL)

    PostgresPort._send_effects = frozen  # type: ignore[method-assign]  # pyright: ignore[reportPrivateUsage]


async def main(config: dict[str, Any]) -> None:
    world = Path(config['world'])
    freeze_in_second_write(world, config['run_id'], config.get('action', 'stop'))
    store = cast(StepStore, stepcore.from_spec(**config['spec']))
    try:
        result = await build_agent(store, run_id=config['run_id']).run('go')
        outcome = f'completed {result.output}'
    except Exception as error:
        outcome = f'{type(error).__name__}: {error}'
    finally:
        await store.aclose()
    (world / f'{config["run_id"]}.outcome').write_text(outcome)


if __name__ == '__main__':
    asyncio.run(main(json.loads(sys.argv[1])))
