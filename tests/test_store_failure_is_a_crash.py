"""A run whose store write fails in a way that passes (a connection dropped under the commit, say) did
not fail: its lease is left as a killed process's would be, so recovery resumes it, and `start_job`
reports the error of the run it started instead of taking it for another starter's job."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from stepcore import InMemoryStepStore, StepPersistence, recover_orphans, recovery_policy, start_job
from stepcore.engine import ops
from stepcore.engine.memory import MemoryPort
from stepcore.store.leases import LeaseState


class Dropped(ConnectionError):
    """The connection went away under a write: whether the commit landed is not known."""


class DroppingPort(MemoryPort):
    """Drops the connection under the write of the tool call's completion, once."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def transient(self, error: Exception, *, write: bool) -> bool:
        return isinstance(error, Dropped) and not write  # passing, yet a write is not made again blindly

    def write_step(self, tx: Any, op: ops.WriteStep) -> Any:
        if self.armed and any(row.status == 'completed' for row in op.effects):
            self.armed = False
            raise Dropped('server closed the connection unexpectedly')
        return super().write_step(tx, op)


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = any(isinstance(p, ToolReturnPart) for m in messages if isinstance(m, ModelRequest) for p in m.parts)
    return ModelResponse(parts=[TextPart('done')] if returned else [ToolCallPart('ship', {}, tool_call_id='s1')])


def _agent(store: InMemoryStepStore, shipped: list[str]) -> Agent[None, str]:
    agent = Agent(FunctionModel(_model), name='shipper', capabilities=[StepPersistence(store=store, lease_ttl=5.0)])

    @recovery_policy('rerun')
    def ship() -> str:
        shipped.append('ship')
        return 'shipped'

    agent.tool_plain(ship)
    return agent


def _store() -> tuple[InMemoryStepStore, DroppingPort]:
    store = InMemoryStepStore()
    port = DroppingPort()
    store.port = port
    port.armed = True
    return store, port


async def test_a_dropped_write_leaves_the_run_to_recovery_which_resumes_it() -> None:
    store, _ = _store()
    shipped: list[str] = []
    with pytest.raises(Dropped):
        await _agent(store, shipped).run('go')
    (run,) = await store.list_runs()
    lease = await store.get_lease(run.run_id)
    assert lease is not None
    assert lease.state is LeaseState.RUNNING  # not ended `failed`: an orphan at once
    assert lease.expired
    assert lease.outcome == 'write failed'
    (outcome,) = await recover_orphans(store, [_agent(store, shipped)])
    assert outcome.outcome == 'resumed', outcome
    assert outcome.detail == "output 'done'"


async def test_start_job_reports_the_error_of_the_run_it_started() -> None:
    store, _ = _store()
    with pytest.raises(Dropped):
        await start_job(_agent(store, []), 'go', job_id='job-1', on_conflict='use_existing', wait=0)
    lease = await store.get_lease('job-1')
    assert lease is not None
    assert lease.state is LeaseState.RUNNING
