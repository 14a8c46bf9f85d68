"""stepcore's OpenTelemetry spans and metrics, through the real SDK (in-memory exporter and reader).

- A run on SQLite: each write is a `stepcore.write` span under pydantic-ai's span of the moment
  (run, model request, tool) when the agent is instrumented, with its backend, run, job, records and
  bytes; the write metrics count the same writes.
- No prompt, model text, tool argument or tool result reaches any attribute or event of stepcore's
  spans, through a run, a resolution and a cancel.
- A zombie fenced in this process: its refused write carries a `stepcore.write.fenced` event, the
  cancel that fenced it is a `stepcore.cancel` span with its `stepcore.claim`.
- A damaged record found while a span is current is an event of that span, and counted.
- Approvals answered and expired are counted.
- In a fresh process: nothing is emitted until the application sets a provider, and what it sets
  after importing stepcore is picked up; and with the `opentelemetry` package missing, stepcore runs
  as before and every telemetry function does nothing.

The SDK's providers are process-wide and set once: the first test module to need them sets them
(keeping its metric reader on the meter provider for the next), each module adds an exporter.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from otel_capture import Capture, fresh_capture
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from step_sqlite import SqliteStepStore
from stepcore import (
    DamagedRecordError,
    InMemoryStepStore,
    RunFencedError,
    StepPersistence,
    apply_deadlines,
    approve_call,
    cancel_run,
    resolve_run,
)


@pytest.fixture
def otel() -> Capture:
    """The process's capture, its exporter emptied."""
    return fresh_capture()


def _strings(span: ReadableSpan) -> list[str]:
    """Every attribute and event value of `span`, as text."""
    values: list[object] = [*(span.attributes or {}).values()]
    for event in span.events:
        values += [event.name, *(event.attributes or {}).values()]
    return [str(value) for value in values]


# --- an agent whose text is distinctive -------------------------------------------------------------------

PROMPT = 'prompt-zebra-7431'
ARGUMENT = 'argument-walrus-2958'
RESULT = 'result-okapi-6610'
ANSWER = 'answer-narwhal-1187'
SECRETS = (PROMPT, ARGUMENT, RESULT, ANSWER)


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
        return ModelResponse(parts=[TextPart(ANSWER)])
    return ModelResponse(parts=[ToolCallPart('lookup', {'text': ARGUMENT}, tool_call_id='call-1')])


def _agent(store: SqliteStepStore, run_id: str, *, instrument: bool = False, **options: Any) -> Agent[None, str]:
    agent = Agent(FunctionModel(_model), capabilities=[StepPersistence(store=store, run_id=run_id, **options)])
    agent.instrument = instrument

    @agent.tool_plain
    def lookup(text: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'{RESULT} for {len(text)} letters'

    return agent


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    opened = SqliteStepStore(database=tmp_path / 'runs.db')
    yield opened
    await opened.aclose()


# --- a run ------------------------------------------------------------------------------------------------


async def test_each_write_of_an_instrumented_run_is_a_span_under_pydantic_ais_span(
    otel: Capture, store: SqliteStepStore
) -> None:
    writes_before = otel.metric('stepcore.store.writes', **{'db.system.name': 'sqlite'})
    timed_before = otel.metric('stepcore.store.write.duration', **{'db.system.name': 'sqlite'})
    bytes_before = otel.metric('stepcore.store.write.bytes', **{'db.system.name': 'sqlite'})

    result = await _agent(store, 'run-1', instrument=True).run(PROMPT)
    assert result.output == ANSWER

    writes = otel.spans('stepcore.write')
    assert len(writes) >= 3  # the run's start, the tool call, the settled tool cycle, the end
    theirs = {s.context.span_id: s for s in otel.all_spans() if s.context is not None}
    parents = set[str]()
    for write in writes:
        assert write.parent is not None, f'{write.name} has no parent span'
        parent = theirs[write.parent.span_id]
        assert parent.instrumentation_scope is not None
        assert parent.instrumentation_scope.name != 'stepcore'
        parents.add(parent.name.split()[0])
        attributes = write.attributes or {}
        assert attributes['db.system.name'] == 'sqlite'
        assert attributes['db.operation.name'] == 'write_batch'
        assert attributes['stepcore.run_id'] == 'run-1'
        assert attributes['stepcore.job_id'] == 'run-1'  # the first run of its chain
        assert isinstance(records := attributes['stepcore.write.records'], int)
        assert records >= 1
        assert isinstance(written := attributes['stepcore.write.bytes'], int)
        assert written > 0
        assert write.kind is trace.SpanKind.CLIENT
    assert {'invoke_agent', 'chat', 'execute_tool'} <= parents, parents
    assert any((w.attributes or {}).get('stepcore.snapshot.state') == 'complete' for w in writes)

    assert otel.metric('stepcore.store.writes', **{'db.system.name': 'sqlite'}) - writes_before == len(writes)
    assert otel.metric('stepcore.store.write.duration', **{'db.system.name': 'sqlite'}) - timed_before == len(writes)
    written_bytes = sum(int(str((w.attributes or {})['stepcore.write.bytes'])) for w in writes)
    assert otel.metric('stepcore.store.write.bytes', **{'db.system.name': 'sqlite'}) - bytes_before == written_bytes


def _long_result_agent(store: Any, run_id: str) -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        del info
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart('done')])
        return ModelResponse(parts=[ToolCallPart('long', {}, tool_call_id='call-1')])

    agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, run_id=run_id)])

    @agent.tool_plain
    def long() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'x' * 60_000

    return agent


def _bytes_written(otel: Capture) -> int:
    return sum(int(str((w.attributes or {})['stepcore.write.bytes'])) for w in otel.spans('stepcore.write'))


async def test_a_writes_bytes_are_what_the_engine_sealed_and_json_for_a_store_of_its_own(
    otel: Capture, store: SqliteStepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the engine's path the bytes are those of the bodies it sealed for the store (nothing is
    serialized again to count them); a store whose `write_batch` is its own is told the JSON size of
    what it was given. Either way a message is counted once, in the write that added it."""
    from stepcore.common import telemetry

    measured = telemetry._payload  # pyright: ignore[reportPrivateUsage]

    def not_on_the_engines_path(*args: Any) -> int:
        raise AssertionError('the engine told the size: nothing is serialized again')

    monkeypatch.setattr(telemetry, '_payload', not_on_the_engines_path)
    assert (await _long_result_agent(store, 'long-1').run('go')).output == 'done'
    assert 60_000 < _bytes_written(otel) < 70_000  # 60,000 letters in one tool return, and the rest

    class OwnBatches(InMemoryStepStore):
        async def write_batch(self, *args: Any, **kwargs: Any) -> None:
            await super().write_batch(*args, **kwargs)

    monkeypatch.setattr(telemetry, '_payload', measured)
    otel.exporter.clear()
    assert (await _long_result_agent(OwnBatches(), 'long-2').run('go')).output == 'done'
    assert 60_000 < _bytes_written(otel) < 70_000


async def test_no_prompt_tool_argument_tool_result_or_model_text_reaches_a_stepcore_span(
    otel: Capture, store: SqliteStepStore
) -> None:
    await _agent(store, 'run-2', instrument=True).run(PROMPT)
    finished = await resolve_run(store, run_id='run-2')
    assert finished.finished
    with pytest.raises(ValueError, match='already ended'):
        await cancel_run(store, run_id='run-2', reason=f'a reason naming {PROMPT}')

    spans = otel.spans()
    assert {'stepcore.write', 'stepcore.claim', 'stepcore.resolve', 'stepcore.cancel'} <= {s.name for s in spans}
    for span in spans:
        for text in _strings(span):
            leaked = [secret for secret in SECRETS if secret in text]
            assert not leaked, f'{span.name} carries {leaked}: {text!r}'
    # pydantic-ai's own spans do carry them (it records content unless told not to): the check looks
    assert any(PROMPT in text for s in otel.all_spans() if s.name.startswith('invoke_agent') for text in _strings(s))


# --- a fenced zombie, a cancel, a claim ---------------------------------------------------------------------


async def test_a_write_of_a_fenced_run_carries_the_refusal_and_the_cancel_is_a_span(
    otel: Capture, store: SqliteStepStore
) -> None:
    fenced_before = otel.metric('stepcore.store.fenced_writes', **{'db.system.name': 'sqlite'})
    won_before = otel.metric('stepcore.claims', **{'stepcore.outcome': 'won'})
    inside, go = asyncio.Event(), asyncio.Event()
    agent = Agent(FunctionModel(_model), capabilities=[StepPersistence(store=store, run_id='zombie-1', lease_ttl=60)])

    @agent.tool_plain
    async def lookup(text: str) -> str:  # pyright: ignore[reportUnusedFunction]
        inside.set()
        await go.wait()
        return f'{RESULT} {len(text)}'

    running = asyncio.create_task(agent.run(PROMPT))
    await asyncio.wait_for(inside.wait(), 30)
    lease = await cancel_run(store, run_id='zombie-1', reason='stopped by the test', by='tester')
    go.set()
    with pytest.raises(RunFencedError):
        await running

    (cancel,) = otel.spans('stepcore.cancel')
    assert cancel.attributes is not None
    assert cancel.attributes['stepcore.outcome'] == 'cancelled'
    assert cancel.attributes['stepcore.resolved_run_id'] == 'zombie-1'
    assert cancel.attributes['stepcore.lease.epoch'] == lease.epoch
    (claim,) = [s for s in otel.spans('stepcore.claim') if s.parent is not None]
    assert claim.parent is not None
    assert cancel.context is not None
    assert claim.parent.span_id == cancel.context.span_id
    assert claim.attributes is not None
    assert claim.attributes['stepcore.outcome'] == 'won'
    assert claim.attributes['stepcore.claim.forced'] is True
    assert otel.metric('stepcore.claims', **{'stepcore.outcome': 'won'}) - won_before == 1

    refused = [w for w in otel.spans('stepcore.write') if any(e.name == 'stepcore.write.fenced' for e in w.events)]
    assert refused, 'no write span tells the refusal'
    for write in refused:
        assert write.attributes is not None
        assert write.attributes['error.type'] == 'stepcore.store.leases.RunFencedError'
        assert write.status.status_code is trace.StatusCode.ERROR
        assert write.status.description is None  # the message may quote a run's content: never sent
        (event,) = [e for e in write.events if e.name == 'stepcore.write.fenced']
        assert event.attributes is not None
        assert event.attributes['stepcore.run_id'] == 'zombie-1'
        assert event.attributes['stepcore.lease.held_epoch'] == lease.epoch - 1
        assert event.attributes['stepcore.lease.epoch'] == lease.epoch
    fenced = otel.metric('stepcore.store.fenced_writes', **{'db.system.name': 'sqlite'}) - fenced_before
    assert fenced == len(refused)


# --- a damaged record -------------------------------------------------------------------------------------


async def test_a_damaged_record_is_an_event_of_the_span_that_found_it(
    otel: Capture, store: SqliteStepStore, tmp_path: Path
) -> None:
    await _agent(store, 'run-3').run(PROMPT)
    with closing(sqlite3.connect(tmp_path / 'runs.db')) as connection, connection:
        changed = connection.execute(
            "UPDATE tool_effects SET record = 'not a record' WHERE run_id = 'run-3' AND tool_call_id = 'call-1'"
        )
        assert changed.rowcount == 1
    before = otel.metric('stepcore.records.damaged', **{'stepcore.damage.kind': 'unparsable'})

    with (
        trace.get_tracer('tests').start_as_current_span('operator reads the ledger'),
        pytest.raises(DamagedRecordError),
    ):
        await store.get_tool_effect(run_id='run-3', tool_call_id='call-1')

    (reading,) = [s for s in otel.all_spans() if s.name == 'operator reads the ledger']
    (event,) = [e for e in reading.events if e.name == 'stepcore.record.damaged']
    assert event.attributes == {
        'stepcore.record': "ledger entry of tool call 'call-1'",
        'stepcore.damage.kind': 'unparsable',
        'stepcore.run_id': 'run-3',
    }
    assert otel.metric('stepcore.records.damaged', **{'stepcore.damage.kind': 'unparsable'}) - before == 1


# --- approvals ---------------------------------------------------------------------------------------------


def _approval_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
        return ModelResponse(parts=[TextPart('done')])
    return ModelResponse(parts=[ToolCallPart('drop_table', {'name': 'users_2019'}, tool_call_id='drop-1')])


async def _paused(store: SqliteStepStore, run_id: str, within: float | None) -> None:
    agent = Agent(
        FunctionModel(_approval_model),
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store=store, run_id=run_id, answer_within=within)],
    )

    @agent.tool_plain(requires_approval=True)
    def drop_table(name: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'dropped {name}'

    assert isinstance((await agent.run('drop it')).output, DeferredToolRequests)


async def test_approvals_answered_and_expired_are_counted(otel: Capture, store: SqliteStepStore) -> None:
    approved = otel.metric('stepcore.approvals.answered', **{'stepcore.outcome': 'approved'})
    expired = otel.metric('stepcore.approvals.expired')

    await _paused(store, 'asks-1', None)
    await approve_call(store, run_id='asks-1', tool_call_id='drop-1', by='ops')
    await approve_call(store, run_id='asks-1', tool_call_id='drop-1', by='ops')  # the same answer: not again
    assert otel.metric('stepcore.approvals.answered', **{'stepcore.outcome': 'approved'}) - approved == 1

    await _paused(store, 'asks-2', 0.01)
    await asyncio.sleep(0.05)
    with trace.get_tracer('tests').start_as_current_span('deadlines'):
        (expiry,) = await apply_deadlines(store)
    assert expiry.recorded
    assert otel.metric('stepcore.approvals.expired') - expired == 1
    (deadlines,) = [s for s in otel.all_spans() if s.name == 'deadlines']
    (event,) = deadlines.events
    assert event.name == 'stepcore.approval.expired'
    assert event.attributes == {
        'stepcore.run_id': 'asks-2',
        'stepcore.tool_call_id': 'drop-1',
        'stepcore.tool_name': 'drop_table',
    }


# --- in a fresh process: no provider yet, then one; no API at all ------------------------------------------

_RUN = textwrap.dedent(
    """
    import asyncio, json, sys, tempfile
    from pathlib import Path
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from step_sqlite import SqliteStepStore
    from stepcore import StepPersistence, cancel_run, resolve_run

    def model(messages, info):
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart('done')])
        return ModelResponse(parts=[ToolCallPart('act', {}, tool_call_id='call-1')])

    async def run(run_id):
        store = SqliteStepStore(database=Path(tempfile.mkdtemp()) / 'runs.db')
        agent = Agent(FunctionModel(model), capabilities=[StepPersistence(store=store, run_id=run_id)])
        agent.tool_plain(lambda: 'acted', name='act')
        output = (await agent.run('go')).output
        resumption = await resolve_run(store, run_id=run_id)
        try:
            await cancel_run(store, run_id=run_id, reason='ended already')
        except ValueError:
            pass
        await store.aclose()
        return output, resumption.finished
    """
)

_LATE_PROVIDER = _RUN + textwrap.dedent(
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from stepcore.common import telemetry

    seen = {'before': telemetry.enabled(), 'first': asyncio.run(run('first'))}
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # after stepcore was imported and had run
    seen['after'] = telemetry.enabled()
    seen['second'] = asyncio.run(run('second'))
    seen['spans'] = sorted({s.name for s in exporter.get_finished_spans()})
    print(json.dumps(seen))
    """
)

_NO_API = (
    textwrap.dedent(
        """
    import sys
    import pydantic_ai  # pydantic-ai itself needs the API: loaded first, then hidden from everything after
    import pydantic_ai.models.function
    for name in [n for n in sys.modules if n == 'opentelemetry' or n.startswith('opentelemetry.')]:
        del sys.modules[name]
    sys.modules['opentelemetry'] = None  # `import opentelemetry` raises ImportError from here on
    """
    )
    + _RUN
    + textwrap.dedent(
        """
    from datetime import datetime, timezone
    from types import SimpleNamespace
    from stepcore import DamagedRecordError
    from stepcore.common import telemetry

    now = datetime.now(timezone.utc)
    lease = SimpleNamespace(run_id='r', epoch=2, origin='r', expires_at=now)
    orphan = SimpleNamespace(run_id='r', why='owner gone', lease=lease)
    outcome = SimpleNamespace(outcome='resumed', resumed_as='r2', claimed_at=now)
    claim = SimpleNamespace(run_id='r', epoch=2, origin='r')
    with telemetry.store_write(object(), 'r', [], None):
        pass
    telemetry.fenced_write(object(), 'r', 1, lease)
    telemetry.damaged_record('r', 'event seq=1', 'unparsable')
    DamagedRecordError(run_id='r', record='event seq=1', where='here', reason='test')
    telemetry.lease_opened('r', 'r')
    with telemetry.claiming(object(), 'r', action='test', force=False) as claiming:
        assert claiming.won(claim) is claim
    with telemetry.recovering_orphan(object(), orphan, now) as recovering:
        assert recovering.done(outcome) is outcome
    with telemetry.cancelling(object(), 'r') as cancelling:
        assert cancelling.done(lease) is lease
    telemetry.approval_answered('approved')
    telemetry.approval_expired('r', SimpleNamespace(tool_call_id='c', tool_name='t'))
    watch = telemetry.OrphanWatch(object())
    watch.listed([orphan])
    watch.waiting_runs([SimpleNamespace(paused_at=now)])
    print(json.dumps({
        'api': telemetry.otel_api,
        'enabled': telemetry.enabled(),
        'runs': asyncio.run(run('no-api')),
        'loaded': sorted(n for n in sys.modules if n.startswith('opentelemetry') and sys.modules[n] is not None),
    }))
    """
    )
)


def _run_child(code: str) -> Mapping[str, Any]:
    import json

    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_provider_set_after_stepcore_was_imported_is_picked_up_at_the_next_write() -> None:
    seen = _run_child(_LATE_PROVIDER)
    assert seen['before'] is False
    assert seen['first'] == ['done', True]
    assert seen['after'] is True
    assert seen['second'] == ['done', True]
    assert {'stepcore.write', 'stepcore.resolve', 'stepcore.claim', 'stepcore.cancel'} <= set(seen['spans'])


def test_without_the_opentelemetry_package_stepcore_runs_and_emits_nothing() -> None:
    seen = _run_child(_NO_API)
    assert seen == {'api': False, 'enabled': False, 'runs': ['done', True], 'loaded': []}
