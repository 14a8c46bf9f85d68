"""The agent of the approval tests, as a module another process imports (`stepcore resume --agent
approval_app:agent`, or `python approval_app.py PROMPT` to start a run that pauses).

Read from the environment: `APPROVAL_SPEC` (the store, as `stepcore.from_spec` keywords, JSON),
`APPROVAL_WORLD` (a folder: every tool call that has its effect appends a line to `effects.txt` there,
outside any store), `APPROVAL_HOLD` (seconds `drop_table` waits after its effect, before it returns,
with a `dropping` file marking that moment), `APPROVAL_WITHIN` (seconds a deferred call waits for its
answer, else as long as it takes).

The model counts the rows of a table and drops it in one response (`drop_table` needs approval),
then reports what the drop returned.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

import stepcore
from stepcore import StepPersistence


def build(store: object, world: Path, *, hold: float = 0.0, within: float | None = None) -> Agent[None, object]:
    """The agent, recording to `store`, its effects counted in `world`."""

    def effect(line: str) -> None:
        with (world / 'effects.txt').open('a') as f:
            f.write(line + '\n')
            f.flush()
            os.fsync(f.fileno())

    built = Agent(
        FunctionModel(model),
        name='dba',
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store=store, lease_ttl=2.0, answer_within=within)],  # pyright: ignore[reportArgumentType]
    )

    @built.tool_plain
    def count_rows(table: str) -> int:  # pyright: ignore[reportUnusedFunction]
        effect(f'count {table}')
        return 3

    @built.tool_plain(requires_approval=True)
    def drop_table(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
        effect(f'drop {name}')
        if hold:
            (world / 'dropping').touch()
            time.sleep(hold)
        return f'dropped {name}'

    return built


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    returned = {p.tool_call_id: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if 'call-drop' in returned:
        return ModelResponse(parts=[TextPart(f'drop_table said: {returned["call-drop"]}')])
    return ModelResponse(
        parts=[
            ToolCallPart('count_rows', {'table': 'users'}, tool_call_id='call-count'),
            ToolCallPart('drop_table', {'name': 'users'}, tool_call_id='call-drop'),
        ]
    )


if 'APPROVAL_SPEC' in os.environ:  # imported by another process: the agent and store it names
    store = stepcore.from_spec(**json.loads(os.environ['APPROVAL_SPEC']))
    agent = build(
        store,
        Path(os.environ['APPROVAL_WORLD']),
        hold=float(os.environ.get('APPROVAL_HOLD', '0')),
        within=float(os.environ['APPROVAL_WITHIN']) if os.environ.get('APPROVAL_WITHIN') else None,
    )


async def _start(prompt: str) -> None:
    result = await agent.run(prompt)
    assert isinstance(result.output, DeferredToolRequests), result.output
    print(result.run_id, flush=True)
    await store.aclose()


if __name__ == '__main__':
    asyncio.run(_start(sys.argv[1]))
