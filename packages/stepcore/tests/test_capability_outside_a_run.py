"""The capability's hooks called with a `RunContext` that no running agent built.

pydantic-ai has no public way to tell a context without an event stream from one whose stream
refuses an event, so `SnapshotSaved` delivery looks at a private attribute, guarded, with a
fallback. These tests hold on every supported pydantic-ai release (scripts/test-oldest.sh runs
them on the oldest): the snapshot is written and the notification is dropped, never raised, when
there is no stream; inside a real run, listeners get it.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, ModelRequestNode
from pydantic_ai.capabilities import Hooks
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import RunContext
from pydantic_ai.usage import RunUsage

from stepcore import InMemoryStepStore, SnapshotSaved, SnapshotState, StepPersistence


def _context(messages: list[ModelMessage]) -> RunContext[None]:
    return RunContext(deps=None, model=TestModel(), usage=RunUsage(), messages=messages, run_id='hand-built')


async def test_a_failure_seen_outside_a_run_is_saved_and_its_notification_dropped() -> None:
    store = InMemoryStepStore()
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content='hello')]),
        ModelResponse(parts=[TextPart(content='half an answer')]),
    ]
    ctx = _context(history)
    capability = await StepPersistence[None](store=store, run_id='outside').for_run(ctx)
    await capability.before_run(ctx)
    # A node hook brings the capability up to the context's history, as the agent graph would.
    await capability.before_node_run(ctx, node=ModelRequestNode[None, Any](request=ModelRequest(parts=[])))
    with pytest.raises(RuntimeError, match='model went away'):
        await capability.on_run_error(ctx, error=RuntimeError('model went away'))

    saved = await store.latest_snapshot('outside', include_interrupted=True)
    assert saved is not None
    assert saved.messages == history
    assert saved.state is SnapshotState.COMPLETE
    assert [e.kind.value for e in await store.list_events('outside')] == ['run_started', 'run_failed']


async def test_inside_a_run_every_snapshot_is_announced() -> None:
    store = InMemoryStepStore()
    seen: list[SnapshotSaved] = []
    hooks = Hooks[Any]()

    @hooks.on.event(SnapshotSaved)
    async def collect(ctx: RunContext[Any], event: SnapshotSaved) -> None:  # pyright: ignore[reportUnusedFunction]
        seen.append(event)

    agent = Agent(TestModel(), capabilities=[StepPersistence(store=store, run_id='inside'), hooks])
    await agent.run('hello')
    snapshots = await store.list_snapshots('inside')
    assert snapshots
    assert [(e.persistence_run_id, e.step_index) for e in seen] == [('inside', s.step_index) for s in snapshots]
