"""A run for `test_resumption_chains.py` to kill: `python resumption_child.py '<job json>'`.

The job names the SQLite database, the notes file, the run id, the run to resume (`resolve_run`
then `Resumption.run`, or none for a fresh run) with the policies to resolve it by, whether to
record with `capture_frontier`, the lease's time to live (`None`: no lease, so no start point is kept),
and where the run stops for good:

- `'before-tools'`: it SIGKILLs itself once the model's response is saved, before any tool starts;
- `'at-start'`: it SIGKILLs itself once the run is registered, before anything else happens;
- `'in-model'` / `'in-tool'`: it touches the `reached` file and hangs inside the model request /
  inside `append_note` after the note was appended, for the test to SIGKILL it.

The agent asks for one call, `append_note(text='one')` (id `note-1`), then answers `done`. The
tool appends a line to the notes file; its recovery policy reads the file to tell whether the
line is there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, CallToolsNode, RunContext, UserPromptNode
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import AgentNode
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_sqlite import SqliteStepStore
from stepcore import Reconciled, StepPersistence, ToolEffectRecord, annotate_tool_effect, recovery_policy, resolve_run

NOTE_CALL = 'note-1'


def note_line(text: str) -> str:
    return f'note::{text}'


class _StopAt(AbstractCapability[Any]):
    """SIGKILLs the process at a node: before the tools of a response run, or at the first node."""

    def __init__(self, where: str | None) -> None:
        self.where = where

    async def before_node_run(self, ctx: RunContext[Any], *, node: AgentNode[Any]) -> AgentNode[Any]:
        if (self.where == 'at-start' and isinstance(node, UserPromptNode)) or (
            self.where == 'before-tools' and isinstance(node, CallToolsNode) and node.model_response.tool_calls
        ):
            os.kill(os.getpid(), signal.SIGKILL)
        return node


def build_agent(
    store: SqliteStepStore,
    notes: Path,
    *,
    run_id: str,
    capture_frontier: bool,
    stop: str | None = None,
    reached: Path | None = None,
    lease_ttl: float | None = 30.0,
) -> Agent[Any, str]:
    """The agent, stopping where `stop` says (see the module's docstring); `reached` is touched before hanging."""

    def hang() -> None:
        assert reached is not None
        reached.touch()
        time.sleep(600)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if stop == 'in-model':
            hang()
        returned = {p.tool_call_id for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
        if NOTE_CALL in returned:
            return ModelResponse(parts=[TextPart('done')])
        return ModelResponse(parts=[ToolCallPart('append_note', {'text': 'one'}, tool_call_id=NOTE_CALL)])

    def note_written(entry: ToolEffectRecord) -> Reconciled | None:
        line = note_line(entry.args['text'])
        found = notes.exists() and line in notes.read_text().splitlines()
        return Reconciled('noted (found after the crash)') if found else None

    agent = Agent(
        FunctionModel(model),
        capabilities=[
            StepPersistence(store=store, run_id=run_id, capture_frontier=capture_frontier, lease_ttl=lease_ttl),
            _StopAt(stop),
        ],
    )

    @agent.tool
    @recovery_policy(note_written)
    async def append_note(ctx: RunContext[Any], text: str) -> str:  # pyright: ignore[reportUnusedFunction]
        await annotate_tool_effect(store, ctx, idempotency_key=note_line(text), effect_summary=f'append {text!r}')
        with notes.open('a') as file:
            file.write(note_line(text) + '\n')
        if stop == 'in-tool':
            hang()
        return 'noted'

    return agent


async def main(job: dict[str, Any]) -> None:
    async with SqliteStepStore(database=job['database']) as store:
        agent = build_agent(
            store,
            Path(job['notes']),
            run_id=job['run_id'],
            capture_frontier=job['capture_frontier'],
            stop=job['stop'],
            reached=Path(job['reached']),
            lease_ttl=job.get('lease_ttl', 30.0),
        )
        if job['resume'] is None:
            await agent.run('note one')
        else:
            resumption = await resolve_run(store, run_id=job['resume'], agent=agent, policies=job.get('policies'))
            await resumption.run(agent)


if __name__ == '__main__':
    asyncio.run(main(json.loads(sys.argv[1])))
