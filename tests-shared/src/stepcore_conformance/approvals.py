"""The approvals section: a run paused on deferred tool calls, answered and resumed through the store.

For every store (the answers rest on the contract: an event's idempotency key is applied once, and
its metadata kept):

- a run that ends with `DeferredToolRequests` is `waiting`: listed by `list_runs(status='waiting')`
  and `list_waiting`, never `completed`, with its deferred calls read back (tool, arguments, kind);
  the call that ran beside them is `completed`, and `continue_run` is the paused history;
- of answers given at the same moment through store objects of their own, exactly one stands;
- the approved call runs once, with the arguments the approval gave, the denied one reaches the
  model as denied, and a run once resumed is never resumed again;
- on a store that keeps leases (feature `leases`) the paused run's lease is `waiting`, it is no
  orphan, and of two resumers at once exactly one proceeds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.tools import DeferredToolRequests

from stepcore import (
    AnswerConflictError,
    LeaseState,
    RunClaimedError,
    RunOwnedError,
    StepPersistence,
    StepStore,
    ToolEffectStatus,
    approve_call,
    continue_run,
    deny_call,
    list_orphans,
    list_waiting,
    read_waiting,
    resume_run,
)
from stepcore.backend import LEASES

from ._support import StoreFixtures, needs_feature, other_store
from .capability import function_model

__all__ = ('ApprovalsConformance',)


def _respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    returned = {p.tool_call_id: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if 'call-drop' in returned:
        return ModelResponse(parts=[TextPart(f'drop: {returned["call-drop"]}; purge: {returned.get("call-purge")}')])
    return ModelResponse(
        parts=[
            ToolCallPart('count_rows', {'table': 'users'}, tool_call_id='call-count'),
            ToolCallPart('drop_table', {'name': 'users'}, tool_call_id='call-drop'),
            ToolCallPart('purge_logs', {'days': 30}, tool_call_id='call-purge'),
        ]
    )


def _agent(store: StepStore, effects: list[str], *, hold: asyncio.Event | None = None) -> Agent[None, Any]:
    agent = Agent(
        function_model(_respond),
        name='dba',
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store=store)],
    )

    @agent.tool_plain
    def count_rows(table: str) -> int:  # pyright: ignore[reportUnusedFunction]
        effects.append(f'count {table}')
        return 3

    @agent.tool_plain(requires_approval=True)
    async def drop_table(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
        effects.append(f'drop {name}')
        if hold is not None:
            await hold.wait()
        return f'dropped {name}'

    @agent.tool_plain(requires_approval=True)
    def purge_logs(days: int) -> str:  # pyright: ignore[reportUnusedFunction]
        effects.append(f'purge {days}')
        return 'purged'

    return agent


class ApprovalsConformance(StoreFixtures):
    """Runs paused on deferred tool calls: stored as waiting, answered once, resumed once."""

    async def test_a_paused_run_is_stored_as_waiting(self, store: StepStore) -> None:
        effects: list[str] = []
        paused = await _agent(store, effects).run('clean up')
        run_id = paused.run_id
        assert isinstance(paused.output, DeferredToolRequests)
        assert effects == ['count users']
        waiting = await read_waiting(store, run_id=run_id)
        assert waiting is not None, 'the pause was not read back: are event metadata kept?'
        assert [(c.tool_call_id, c.tool_name, c.args, c.kind) for c in waiting.calls] == [
            ('call-drop', 'drop_table', {'name': 'users'}, 'approval'),
            ('call-purge', 'purge_logs', {'days': 30}, 'approval'),
        ]
        assert run_id in {r.run_id for r in await store.list_runs(status='waiting')}
        assert run_id not in {r.run_id for r in await store.list_runs(status='completed')}
        assert run_id in {w.run_id for w in await list_waiting(store)}
        count = await store.get_tool_effect(run_id=run_id, tool_call_id='call-count')
        assert count is not None
        assert count.status is ToolEffectStatus.COMPLETED  # its result is in the paused history
        assert await continue_run(store, run_id=run_id) == paused.all_messages()

    @needs_feature(LEASES)
    async def test_a_paused_run_holds_a_waiting_lease_and_is_no_orphan(self, store: StepStore) -> None:
        run_id = (await _agent(store, []).run('clean up')).run_id
        lease = await store.get_lease(run_id)
        assert lease is not None
        assert lease.state is LeaseState.WAITING
        assert run_id in {x.run_id for x in await store.list_leases([LeaseState.WAITING])}
        assert run_id not in {o.run_id for o in await list_orphans(store)}

    async def test_answers_given_at_once_one_stands(self, store: StepStore, store_spec: dict[str, Any] | None) -> None:
        run_id = (await _agent(store, []).run('clean up')).run_id
        async with other_store(store, store_spec) as second, other_store(store, store_spec) as third:
            stores = [store, second, third]

            async def answer(n: int) -> object:
                on = stores[n % len(stores)]
                if n % 2:
                    return await deny_call(on, run_id=run_id, tool_call_id='call-drop', message=f'no {n}', by=f'p{n}')
                return await approve_call(on, run_id=run_id, tool_call_id='call-drop', by=f'p{n}')

            outcomes = await asyncio.gather(*(answer(n) for n in range(6)), return_exceptions=True)
        kept = [o for o in outcomes if not isinstance(o, BaseException)]
        refused = [o for o in outcomes if isinstance(o, AnswerConflictError)]
        assert len(kept) + len(refused) == len(outcomes), outcomes
        assert kept, outcomes
        assert all(k == kept[0] for k in kept), kept  # only answers alike to the one standing succeed
        waiting = await read_waiting(store, run_id=run_id)
        assert waiting is not None
        assert waiting.answers['call-drop'] == kept[0]

    async def test_approved_with_other_args_runs_once_and_a_denial_reaches_the_model(self, store: StepStore) -> None:
        effects: list[str] = []
        agent = _agent(store, effects)
        run_id = (await agent.run('clean up')).run_id
        await approve_call(store, run_id=run_id, tool_call_id='call-drop', override_args={'name': 'guests'}, by='a')
        await deny_call(store, run_id=run_id, tool_call_id='call-purge', message='keep the logs', by='b')
        result = await resume_run(store, run_id=run_id, agent=agent)
        assert result.output == 'drop: dropped guests; purge: keep the logs'
        assert effects == ['count users', 'drop guests']
        with pytest.raises(RuntimeError, match='already ended with a final response'):
            await resume_run(store, run_id=run_id, agent=agent)
        assert effects == ['count users', 'drop guests']
        assert run_id not in {w.run_id for w in await list_waiting(store)}
        waiting = await read_waiting(store, run_id=run_id)
        assert waiting is not None
        assert waiting.resumed_by == result.run_id

    @needs_feature(LEASES)
    async def test_of_two_resumers_one_proceeds(self, store: StepStore, store_spec: dict[str, Any] | None) -> None:
        effects: list[str] = []
        run_id = (await _agent(store, effects).run('clean up')).run_id
        await approve_call(store, run_id=run_id, tool_call_id='call-drop')
        await approve_call(store, run_id=run_id, tool_call_id='call-purge')
        hold = asyncio.Event()
        async with other_store(store, store_spec) as second:

            async def resume(on: StepStore) -> object:
                try:
                    return await resume_run(on, run_id=run_id, agent=_agent(on, effects, hold=hold))
                except (RunOwnedError, RunClaimedError) as refused:
                    hold.set()  # the loser is told at once: let the winner finish
                    return refused

            outcomes = await asyncio.wait_for(asyncio.gather(resume(store), resume(second)), timeout=60)
        refused = [o for o in outcomes if isinstance(o, RunOwnedError | RunClaimedError)]
        assert len(refused) == 1, outcomes
        assert effects.count('drop users') == 1, effects
        assert effects.count('purge 30') == 1, effects
