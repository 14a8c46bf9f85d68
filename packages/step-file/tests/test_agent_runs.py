"""A real pydantic-ai Agent persisting through FileStepStore."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_file import FileStepStore
from stepcore import StepPersistence, continue_run

STEPS = 6


def _agent(store: FileStepStore) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls = sum(isinstance(m, ModelResponse) for m in messages)
        if calls < STEPS:
            return ModelResponse(parts=[ToolCallPart('fetch', {'n': calls}, tool_call_id=f'call-{calls}')])
        return ModelResponse(parts=[TextPart('done')])

    agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, run_id='agent-run')])

    @agent.tool_plain
    def fetch(n: int) -> str:
        return f'page {n} ' * 200

    return agent


async def test_agent_run_round_trips_and_stores_each_tool_return_once(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    result = await _agent(store).run('read every page')

    fresh = FileStepStore(tmp_path)
    assert await continue_run(fresh, run_id='agent-run') == result.all_messages()
    snapshots = await fresh.list_snapshots('agent-run', include_interrupted=True)
    assert len(snapshots) >= STEPS
    assert [len(s.messages) for s in snapshots] == sorted(len(s.messages) for s in snapshots)

    # A tool cycle's snapshot is written with the next request's start, once pydantic-ai has
    # stamped that request for sending: every message is stored once, none needs a restamp line.
    nodes = [json.loads(line) for line in (tmp_path / 'agent-run' / 'messages.jsonl').read_text().splitlines()]
    full = [n for n in nodes if 'body' in n]
    assert [n for n in nodes if 'base' in n] == []
    assert len(full) == len(result.all_messages())
    page_copies = sum(json.dumps(n['body']).count('page 3 page 3') > 0 for n in full)
    assert page_copies == 1
