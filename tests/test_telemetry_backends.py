"""stepcore's spans and metrics on SQLite and PostgreSQL, around real crashes (the real OpenTelemetry SDK).

- A run: its writes are `stepcore.write` spans under pydantic-ai's spans, named for the backend.
- A run killed with SIGKILL inside its tool, in a child process, is resolved here: the
  `stepcore.resolve` span holds the claim and one `stepcore.settlement` event per cut-short call, and
  the resumption's writes carry the job of the run they resume.
- The recovery loop: an orphan it has no agent for is counted among the waiting ones (and the age of
  the oldest); one it resumes is a `stepcore.recover_orphan` span over the resolution and the resumed
  run, and the time from its listing to its claim is measured.
- A zombie (a run cancelled while its tool runs): its refused write is an event of its write span.
- Nothing of the runs' content (prompt, tool arguments and results, model text) reaches a stepcore span.

PostgreSQL's cases skip without `STEP_POSTGRES_URL` (each uses tables of its own).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from otel_capture import Capture, fresh_capture
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import stepcore
from stepcore import (
    OrphanOutcome,
    RunFencedError,
    RunRecord,
    StepPersistence,
    StepStore,
    cancel_run,
    recovery_policy,
    resolve_run,
    run_recovery_loop,
)

# --- the SDK, process-wide (see packages/stepcore/tests/test_telemetry.py, which shares it) -----------------


@pytest.fixture
def otel() -> Capture:
    return fresh_capture()


# --- the stores ---------------------------------------------------------------------------------------------


@pytest.fixture(params=['sqlite', 'postgres'])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == 'sqlite':
        return {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')}
    url = os.environ.get('STEP_POSTGRES_URL')
    if not url:
        pytest.skip('STEP_POSTGRES_URL is not set: start a server with scripts/postgres-server.sh start')
    return {'backend': 'postgres', 'dsn': url, 'table_prefix': f'otel_{uuid.uuid4().hex[:10]}'}


@pytest.fixture
async def store(spec: dict[str, Any]) -> AsyncIterator[StepStore]:
    opened = cast(StepStore, stepcore.from_spec(**spec))
    yield opened
    await opened.aclose()


def _system(spec: dict[str, Any]) -> str:
    return {'sqlite': 'sqlite', 'postgres': 'postgresql'}[spec['backend']]


# --- the shipping agent, its text distinctive ---------------------------------------------------------------

PROMPT = 'prompt-ibex-5120'
ARGUMENT = 'parcel-tapir-8843'
RESULT = 'shipped-quokka-3071'
ANSWER = 'answer-axolotl-9262'
SECRETS = (PROMPT, ARGUMENT, RESULT, ANSWER)


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
        return ModelResponse(parts=[TextPart(ANSWER)])
    return ModelResponse(parts=[ToolCallPart('ship', {'parcel': ARGUMENT}, tool_call_id='call-ship')])


def _agent(store: StepStore, *, run_id: str | None = None) -> Agent[None, str]:
    """The child's agent, instrumented, in this process."""
    agent = Agent(FunctionModel(_model), name='shipper', capabilities=[StepPersistence(store=store, run_id=run_id)])
    agent.instrument = True

    @agent.tool_plain
    @recovery_policy('rerun')
    def ship(parcel: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'{RESULT} ({len(parcel)})'

    return agent


CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    import stepcore
    from stepcore import StepPersistence

    job = json.loads(sys.argv[1])

    def model(messages, info):
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart(job['answer'])])
        return ModelResponse(parts=[ToolCallPart('ship', {'parcel': job['argument']}, tool_call_id='call-ship')])

    async def main():
        store = stepcore.from_spec(**job['spec'])
        agent = Agent(FunctionModel(model), name='shipper',
                      capabilities=[StepPersistence(store=store, run_id=job['run_id'])])

        @agent.tool_plain
        def ship(parcel: str) -> str:
            Path(job['reached']).touch()
            time.sleep(600)
            return 'shipped'

        await agent.run(job['prompt'])

    asyncio.run(main())
    """
)


def _killed_in_its_tool(spec: dict[str, Any], run_id: str, folder: Path) -> None:
    """Run the shipping agent as `run_id` in a child process and kill it with SIGKILL inside its tool."""
    reached = folder / f'{run_id}.reached'
    job = {
        'spec': spec,
        'run_id': run_id,
        'reached': str(reached),
        'prompt': PROMPT,
        'argument': ARGUMENT,
        'answer': ANSWER,
    }
    child = subprocess.Popen([sys.executable, '-c', CHILD, json.dumps(job)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not reached.exists():
            if child.poll() is not None:
                stderr = child.stderr.read().decode() if child.stderr else ''
                pytest.fail(f'the agent process ended early: {stderr[-2000:]}')
            assert time.monotonic() < deadline, 'the agent process never reached its tool'
            time.sleep(0.02)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if child.stderr is not None:
            child.stderr.close()


# --- reading traces -----------------------------------------------------------------------------------------


def _children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


_SHOWN = (
    'stepcore.run_id',
    'stepcore.job_id',
    'stepcore.outcome',
    'stepcore.resumed_as',
    'stepcore.orphan.reason',
    'stepcore.claim.action',
    'stepcore.write.records',
    'stepcore.snapshot.state',
)


def tree(spans: list[ReadableSpan], root: ReadableSpan, ids: dict[str, str], depth: int = 0) -> Iterator[str]:
    """`root` and the spans under it, one indented line each, with its main attributes (run ids as
    `ids` names them) and its events."""
    attributes = root.attributes or {}
    shown = ' '.join(
        f'{key.removeprefix("stepcore.")}={ids.get(str(v), v)}'
        for key in _SHOWN
        if (v := attributes.get(key)) is not None
    )
    yield f'{"  " * depth}{root.name}{"  " + shown if shown else ""}'
    for event in root.events:
        facts = ' '.join(f'{k.removeprefix("stepcore.")}={v}' for k, v in (event.attributes or {}).items())
        yield f'{"  " * (depth + 1)}· {event.name}  {facts}'
    for child in _children(spans, root):
        yield from tree(spans, child, ids, depth + 1)


def _no_content(capture: Capture) -> None:
    for span in capture.spans():
        values: list[object] = [*(span.attributes or {}).values()]
        for event in span.events:
            values += [event.name, *(event.attributes or {}).values()]
        leaked = [(secret, value) for value in values for secret in SECRETS if secret in str(value)]
        assert not leaked, f'{span.name} carries {leaked}'


class Seen(list[OrphanOutcome]):
    """The outcomes a recovery loop reports for one run."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.arrived = asyncio.Event()

    def add(self, outcome: OrphanOutcome) -> None:
        if outcome.run_id == self.run_id:
            self.append(outcome)
            self.arrived.set()

    async def until(self, kind: str, seconds: float = 30.0) -> OrphanOutcome:
        async with asyncio.timeout(seconds):
            while not (found := [o for o in self if o.outcome == kind]):
                self.arrived.clear()
                await self.arrived.wait()
        return found[0]


def _nobody(record: RunRecord | None) -> Agent[None, str] | None:
    """A worker with no agent for any run."""
    del record
    return None


# --- the tests ----------------------------------------------------------------------------------------------


async def test_a_runs_writes_are_spans_named_for_its_backend(
    otel: Capture, spec: dict[str, Any], store: StepStore
) -> None:
    system = _system(spec)
    before = otel.metric('stepcore.store.writes', **{'db.system.name': system})
    run_id = f'run-{uuid.uuid4().hex[:8]}'
    assert (await _agent(store, run_id=run_id).run(PROMPT)).output == ANSWER

    writes = otel.spans('stepcore.write')
    assert writes
    theirs = {s.context.span_id: s for s in otel.all_spans() if s.context is not None}
    for write in writes:
        assert write.attributes is not None
        assert write.attributes['db.system.name'] == system
        assert write.attributes['stepcore.run_id'] == run_id
        assert write.parent is not None
        assert theirs[write.parent.span_id].name.split()[0] in ('invoke_agent', 'chat', 'execute_tool')
    assert otel.metric('stepcore.store.writes', **{'db.system.name': system}) - before == len(writes)
    _no_content(otel)


async def test_a_killed_run_resolved_and_resumed_is_traced_with_its_settlements(
    otel: Capture, spec: dict[str, Any], store: StepStore, tmp_path: Path
) -> None:
    system = _system(spec)
    run_id = f'killed-{uuid.uuid4().hex[:8]}'
    _killed_in_its_tool(spec, run_id, tmp_path)
    resumed_before = otel.metric('stepcore.resumptions', **{'db.system.name': system})
    agent = _agent(store)

    resumption = await resolve_run(store, run_id=run_id, agent=agent)
    result = await resumption.run(agent)
    assert result.output == ANSWER

    (resolve,) = otel.spans('stepcore.resolve')
    assert resolve.attributes is not None
    assert resolve.attributes['stepcore.run_id'] == run_id
    assert resolve.attributes['stepcore.resolved_run_id'] == run_id
    assert resolve.attributes['stepcore.job_id'] == run_id
    assert resolve.attributes['stepcore.outcome'] == 'ready'
    assert resolve.attributes['stepcore.ownership'] == 'claimed'
    (settled,) = resolve.events
    assert settled.name == 'stepcore.settlement'
    assert settled.attributes == {
        'stepcore.tool_call_id': 'call-ship',
        'stepcore.tool_name': 'ship',
        'stepcore.outcome': 'rerun',
    }
    (claim,) = _children(otel.all_spans(), resolve)
    assert claim.name == 'stepcore.claim'
    assert claim.attributes is not None
    assert claim.attributes['stepcore.outcome'] == 'won'
    assert claim.attributes['stepcore.claim.action'] == 'resolve_run'
    assert claim.attributes['stepcore.job_id'] == run_id
    assert otel.metric('stepcore.resumptions', **{'db.system.name': system}) - resumed_before == 1

    resumed = [w for w in otel.spans('stepcore.write') if (w.attributes or {}).get('stepcore.run_id') == result.run_id]
    assert resumed, 'the resumption wrote nothing traced'
    assert all((w.attributes or {}).get('stepcore.job_id') == run_id for w in resumed)  # the job it resumes
    _no_content(otel)


async def test_the_recovery_loop_gauges_its_waiting_orphans_and_times_their_pickup(
    otel: Capture, spec: dict[str, Any], store: StepStore, tmp_path: Path
) -> None:
    system = _system(spec)
    run_id = f'orphan-{uuid.uuid4().hex[:8]}'
    _killed_in_its_tool(spec, run_id, tmp_path)
    listed_before = otel.metric('stepcore.orphans.listed', **{'db.system.name': system})
    picked_before = otel.metric('stepcore.orphans.pickup.duration', **{'db.system.name': system})
    won_before = otel.metric('stepcore.claims', **{'db.system.name': system, 'stepcore.outcome': 'won'})

    # A worker without the agent: the orphan waits, and the gauges say so.
    seen = Seen(run_id)
    stop = asyncio.Event()
    loop = asyncio.create_task(run_recovery_loop(store, _nobody, interval=0.05, stop=stop, on_outcome=seen.add))
    waited = await seen.until('unknown agent')
    assert waited.run_id == run_id
    assert otel.metric('stepcore.orphans.waiting', **{'db.system.name': system}) >= 1
    assert otel.metric('stepcore.orphans.oldest_age', **{'db.system.name': system}) >= 0.0
    assert otel.metric('stepcore.orphans.listed', **{'db.system.name': system}) - listed_before >= 1
    stop.set()
    await loop

    # A worker that runs it: claimed, resolved and resumed.
    agent = _agent(store)

    def ours(record: RunRecord | None) -> Agent[None, str] | None:
        return agent if record is not None and record.run_id == run_id else None

    seen = Seen(run_id)
    stop = asyncio.Event()
    loop = asyncio.create_task(run_recovery_loop(store, ours, interval=0.05, stop=stop, on_outcome=seen.add))
    outcome = await seen.until('resumed', 60)
    stop.set()
    await loop
    assert outcome.resumed_as is not None

    (recovered,) = [
        s
        for s in otel.spans('stepcore.recover_orphan')
        if (s.attributes or {}).get('stepcore.outcome') == 'resumed'
        and (s.attributes or {}).get('stepcore.run_id') == run_id
    ]
    assert recovered.attributes is not None
    assert recovered.attributes['stepcore.resumed_as'] == outcome.resumed_as
    assert recovered.attributes['stepcore.job_id'] == run_id
    assert recovered.attributes['stepcore.orphan.reason'] == 'owner gone'
    spans = otel.all_spans()
    under = [s.name.split()[0] for s in _children(spans, recovered)]
    assert under[:2] == ['stepcore.resolve', 'invoke_agent'], under
    assert otel.metric('stepcore.orphans.pickup.duration', **{'db.system.name': system}) - picked_before == 1
    claims = otel.metric('stepcore.claims', **{'db.system.name': system, 'stepcore.outcome': 'won'})
    assert claims - won_before == 1
    _no_content(otel)

    picture = '\n'.join(tree(spans, recovered, {run_id: 'RUN', outcome.resumed_as: 'RESUMPTION'}))
    print(picture)
    assert '· stepcore.settlement  tool_call_id=call-ship tool_name=ship outcome=rerun' in picture
    assert picture == _documented_trace(), 'docs/observability.md shows another trace than this run made'


def _documented_trace() -> str:
    """The picture of a recovered run's trace in docs/observability.md (its first `text` block
    after the heading)."""
    page = (Path(__file__).parents[1] / 'docs' / 'observability.md').read_text(encoding='utf-8')
    section = page.split("## One recovered run's trace", 1)[1]
    return section.split('```text\n', 1)[1].split('\n```', 1)[0]


async def test_a_zombies_refused_write_is_an_event_of_its_write_span(
    otel: Capture, spec: dict[str, Any], store: StepStore
) -> None:
    system = _system(spec)
    fenced_before = otel.metric('stepcore.store.fenced_writes', **{'db.system.name': system})
    run_id = f'zombie-{uuid.uuid4().hex[:8]}'
    inside, go = asyncio.Event(), asyncio.Event()
    agent = Agent(FunctionModel(_model), capabilities=[StepPersistence(store=store, run_id=run_id, lease_ttl=60)])
    agent.instrument = True

    @agent.tool_plain
    async def ship(parcel: str) -> str:  # pyright: ignore[reportUnusedFunction]
        inside.set()
        await go.wait()
        return f'{RESULT} {len(parcel)}'

    running = asyncio.create_task(agent.run(PROMPT))
    await asyncio.wait_for(inside.wait(), 30)
    await cancel_run(store, run_id=run_id, reason='the customer called back', by='ops')
    go.set()
    with pytest.raises(RunFencedError):
        await running

    refused = [w for w in otel.spans('stepcore.write') if any(e.name == 'stepcore.write.fenced' for e in w.events)]
    assert refused, 'no write span tells the refusal'
    for write in refused:
        assert write.attributes is not None
        assert write.attributes['db.system.name'] == system
        assert write.attributes['error.type'] == 'stepcore.store.leases.RunFencedError'
    assert otel.metric('stepcore.store.fenced_writes', **{'db.system.name': system}) - fenced_before == len(refused)
    _no_content(otel)
