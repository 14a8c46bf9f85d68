"""A subclass of `SqliteStepStore` with a connection helper of its own, as a conversations service writes it.

A library built on the reference subclasses the SQLite store to add `delete_runs`, `ping` and
`transient_errors`, and sets `self._driver` to its own connection helper in `__init__`. The store's
own state must not live under that name (or any other a subclass is likely to pick): the subclass
runs a real agent for three turns of one conversation and then deletes its runs.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence, ToolEffectStatus, continue_run


class SqliteDriver:
    """The service's own connection helper: a plain connection to the same database file."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.connection = sqlite3.connect(database, check_same_thread=False)

    def ping(self) -> bool:
        return self.connection.execute('SELECT 1').fetchone() == (1,)

    def close(self) -> None:
        self.connection.close()


class ConversationStore(SqliteStepStore):
    """The service's store: the SQLite store, a health check and a purge."""

    def __init__(self, database: Path, **options: Any) -> None:
        super().__init__(database=database, **options)
        self._driver = SqliteDriver(database)
        self._db = 'conversations'  # another name a subclass picks for itself
        self._closed = False

    @property
    def transient_errors(self) -> tuple[type[Exception], ...]:
        return (sqlite3.OperationalError,)

    async def ping(self) -> bool:
        return self._driver.ping()

    async def delete_runs(self, *, run_ids: list[str]) -> int:
        return sum([await self.delete_run(run_id) for run_id in run_ids])

    async def aclose(self) -> None:
        self._driver.close()
        self._closed = True
        await super().aclose()


def _turns(messages: list[ModelMessage]) -> int:
    return sum(isinstance(m, ModelRequest) and any(isinstance(p, UserPromptPart) for p in m.parts) for m in messages)


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = _turns(messages)
    if isinstance(messages[-1], ModelRequest) and isinstance(messages[-1].parts[0], UserPromptPart):
        return ModelResponse(parts=[ToolCallPart('remember', {'turn': turn}, tool_call_id=f'remember-{turn}')])
    return ModelResponse(parts=[TextPart(f'turn {turn} remembered')])


async def test_a_subclass_with_its_own_driver_runs_a_conversation_and_deletes_it(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / 'conversations.db')
    assert isinstance(store._driver, SqliteDriver)
    assert await store.ping()
    assert store.transient_errors == (sqlite3.OperationalError,)
    remembered: list[int] = []
    agent = Agent(FunctionModel(_model), capabilities=[StepPersistence(store=store, agent_name='assistant')])

    @agent.tool_plain
    def remember(turn: int) -> str:  # pyright: ignore[reportUnusedFunction]
        remembered.append(turn)
        return f'noted turn {turn}'

    history: list[ModelMessage] = []
    run_ids: list[str] = []
    for turn in (1, 2, 3):
        result = await agent.run(f'turn {turn}', message_history=history, conversation_id='conv-1')
        assert result.output == f'turn {turn} remembered'
        # with agent_name, the stored run id is derived from it and pydantic-ai's run id
        run_ids.append((await store.list_runs(conversation_id='conv-1', newest_first=True, limit=1))[0].run_id)
        history = await continue_run(store, run_id=run_ids[-1])
        assert history == result.all_messages()
    assert remembered == [1, 2, 3]

    runs = await store.list_runs(conversation_id='conv-1')
    assert [r.run_id for r in runs] == run_ids
    assert {r.agent_name for r in runs} == {'assistant'}
    for run_id in run_ids:
        (effect,) = await store.list_tool_effects(run_id)
        assert effect.status is ToolEffectStatus.COMPLETED

    assert await store.delete_runs(run_ids=run_ids) == 3
    assert await store.list_runs(conversation_id='conv-1') == []
    assert await store.ping()
    assert isinstance(store._driver, SqliteDriver)
    await store.aclose()
    assert store._closed

    reopened = SqliteStepStore(database=tmp_path / 'conversations.db')
    try:
        assert await reopened.list_runs() == []
    finally:
        await reopened.aclose()
