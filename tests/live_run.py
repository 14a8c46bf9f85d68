"""A run a live owner holds: a real agent run held inside its tool, in a thread of the test's process
(which holds the run's lease and renews it), until the `with` block ends. Shared by the command line's
and the inspector's tests of how a live run is described."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import TracebackType

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence

__all__ = ('LiveRun', 'send_model')


def send_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Call `send` once, then say `sent`."""
    del info
    if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
        return ModelResponse(parts=[TextPart('sent')])
    return ModelResponse(parts=[ToolCallPart('send', {'to': 'team@example.com'}, tool_call_id='call-send')])


class LiveRun:
    """`run_id` of a `mailer` agent on the SQLite `database`, inside its `send` tool until the block ends;
    `output` is what the run answered once it did."""

    def __init__(self, database: Path, run_id: str) -> None:
        self.database = database
        self.run_id = run_id
        self.output: object = None
        self._inside = threading.Event()
        self._go = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        store = SqliteStepStore(database=self.database)
        agent = Agent(FunctionModel(send_model), name='mailer', capabilities=[StepPersistence(store=store)])

        @agent.tool_plain
        def send(to: str) -> str:  # pyright: ignore[reportUnusedFunction]
            self._inside.set()
            assert self._go.wait(180), 'the test never let the tool return'
            return f'sent to {to}'

        try:
            self.output = (await agent.run('send the report', run_id=self.run_id)).output
        finally:
            await store.aclose()

    def __enter__(self) -> LiveRun:
        self._thread.start()
        assert self._inside.wait(60), f'run {self.run_id} never reached its tool'
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._go.set()
        self._thread.join(180)
        assert not self._thread.is_alive()
