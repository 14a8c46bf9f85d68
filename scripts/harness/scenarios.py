"""The runs the fixtures hold: real agents on a scripted `FunctionModel`, persisted by the reference library."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, BinaryContent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai_harness.step_persistence import (
    FileStepStore,
    SqliteStepStore,
    StepPersistence,
    StepStore,
    annotate_tool_effect,
    conversations,
)
from pydantic_ai_harness.step_persistence.conversations import ConversationSummary, SqliteConversationStore

ENTRY = Path(__file__).with_name('make_fixtures.py')
"""Started again as a child process with `--crash-child` to run the run that is killed."""
MODEL_NAME = 'fixture-model'
CRASH_EXIT_CODE = 17
MEDIA_BYTES = 64 * 1024
"""The reference's default `media_threshold_bytes`; a payload of exactly this size is externalized."""


CHECKOUT = {'repository': '/workspace/demo/.git', 'name': 'demo', 'root': '/workspace/demo', 'branch': 'main'}
"""The Git checkout recorded with the conversation head, by releases that record one."""


Step = ModelResponse | Exception


def scripted(*steps: Step) -> FunctionModel:
    """A model that answers each request with the next step, raising it when it is an exception."""
    remaining: Iterator[Step] = iter(steps)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = next(remaining)
        if isinstance(step, Exception):
            raise step
        return step

    return FunctionModel(respond, model_name=MODEL_NAME)


def call(tool_name: str, tool_call_id: str, **args: Any) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool_name=tool_name, args=args, tool_call_id=tool_call_id)])


def answer(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content=text)])


def fixture_png(size: int) -> bytes:
    """`size` deterministic bytes behind a PNG signature (not a decodable image; only the bytes matter)."""
    signature = b'\x89PNG\r\n\x1a\n'
    body = bytearray()
    state = 0x2545F491
    while len(signature) + len(body) < size:
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        body.append(state >> 16 & 0xFF)
    return signature + bytes(body[: size - len(signature)])


def large_text(size: int) -> str:
    line = 'row {:05d}: the quick brown fox jumps over the lazy dog\n'
    text = ''.join(line.format(i) for i in range(size // len(line.format(0)) + 1))
    return text[:size]


Scenario = dict[str, Any]
"""What the script declares about a run before reading the store: expectations checked afterwards."""


async def run_finished(store: StepStore) -> list[Scenario]:
    agent = Agent(
        scripted(call('lookup', 'call-finished-1', key='alpha'), answer('alpha is 1')),
        name='fixture_agent',
        capabilities=[StepPersistence(store=store, run_id='fx-finished', metadata={'suite': 'harness-fixtures'})],
    )

    @agent.tool_plain
    def lookup(key: str) -> str:
        return f'{key}=1'

    result = await agent.run('what is alpha?', conversation_id='conv-finished', run_id='ctx-finished')
    assert result.output == 'alpha is 1'
    return [
        {
            'run_id': 'fx-finished',
            'ctx_run_id': 'ctx-finished',
            'scenario': 'finished',
            'description': 'one tool cycle then a final answer; agent_name unset so the Agent.name is recorded',
            'outcome': 'completed',
        }
    ]


def crash_child_store(backend: str, location: str) -> StepStore:
    if backend == 'sqlite':
        return SqliteStepStore(database=location)
    return FileStepStore(location)


async def run_crashed_in_child(backend: str, location: str) -> None:
    """Runs inside the child process: the second tool call kills the process after annotating its effect."""
    store = crash_child_store(backend, location)
    agent = Agent(
        scripted(
            call('reserve', 'call-crash-1', item='book'),
            call('charge', 'call-crash-2', order='42', cents=1999),
            answer('unreachable'),
        ),
        name='shop_agent',
        capabilities=[StepPersistence(store=store, run_id='fx-crashed', agent_name='shop', capture_frontier=True)],
    )

    @agent.tool_plain
    def reserve(item: str) -> str:
        return f'reserved {item}'

    @agent.tool
    async def charge(ctx: RunContext[None], order: str, cents: int) -> str:
        await annotate_tool_effect(
            store,
            ctx,
            idempotency_key=f'charge-order-{order}',
            effect_summary=f'charge {cents} cents for order {order}',
        )
        os._exit(CRASH_EXIT_CODE)

    await agent.run('buy the book', conversation_id='conv-crash', run_id='ctx-crashed')


async def run_crashed(backend: str, location: str) -> list[Scenario]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(ENTRY), '--crash-child', backend, location, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await child.communicate()
    if child.returncode != CRASH_EXIT_CODE:
        raise RuntimeError(f'crash child exited {child.returncode}, expected {CRASH_EXIT_CODE}:\n{stderr.decode()}')
    return [
        {
            'run_id': 'fx-crashed',
            'ctx_run_id': 'ctx-crashed',
            'scenario': 'crashed_mid_tool',
            'description': (
                'capture_frontier=True; reserve completes, charge annotates its effect then the process is killed '
                '(no hook runs): ledger entry started, newest snapshot interrupted, no run_completed/run_failed'
            ),
            'outcome': 'crashed',
        }
    ]


async def run_tool_failed(store: StepStore) -> list[Scenario]:
    agent = Agent(
        scripted(call('refund', 'call-failed-1', order='7'), answer('unreachable')),
        name='refund_agent',
        capabilities=[StepPersistence(store=store, run_id='fx-tool-failed', agent_name='refunds')],
    )

    @agent.tool
    async def refund(ctx: RunContext[None], order: str) -> str:
        await annotate_tool_effect(store, ctx, idempotency_key=f'refund-{order}')
        raise ValueError('card declined')

    try:
        await agent.run('refund order 7', conversation_id='conv-refund', run_id='ctx-tool-failed')
    except ValueError as error:
        failure = error
    else:
        raise AssertionError('the refund run should fail')
    assert str(failure) == 'card declined'
    return [
        {
            'run_id': 'fx-tool-failed',
            'ctx_run_id': 'ctx-tool-failed',
            'scenario': 'tool_failed',
            'description': (
                'the tool annotates only an idempotency key and raises ValueError: ledger entry failed with '
                'effect_summary repr(error), run fails, failure snapshot interrupted'
            ),
            'outcome': 'failed',
        }
    ]


async def run_media(store: StepStore) -> list[Scenario]:
    agent = Agent(
        scripted(call('read_log', 'call-media-1', name='build.log'), answer('the log is long')),
        name='vision_agent',
        capabilities=[StepPersistence(store=store, run_id='fx-media', agent_name='vision')],
    )

    @agent.tool_plain
    def read_log(name: str) -> str:
        return large_text(MEDIA_BYTES)

    prompt = [
        'describe these images and read the log',
        BinaryContent(data=fixture_png(MEDIA_BYTES), media_type='image/png'),
        BinaryContent(data=fixture_png(16), media_type='image/png'),
    ]
    await agent.run(prompt, conversation_id='conv-media', run_id='ctx-media')
    return [
        {
            'run_id': 'fx-media',
            'ctx_run_id': 'ctx-media',
            'scenario': 'media',
            'description': (
                f'prompt with a {MEDIA_BYTES} byte BinaryContent (externalized) and a 16 byte one (inline); the tool '
                f'returns {MEDIA_BYTES} bytes of text (externalized as text/plain)'
            ),
            'outcome': 'completed',
        }
    ]


async def run_conversation(store: StepStore) -> list[Scenario]:
    persistence = StepPersistence(store=store, agent_name='chat')
    first = Agent(scripted(answer('hello, how can I help?')), name='chat_agent', capabilities=[persistence])
    result = await first.run('hi', conversation_id='conv-shared', run_id='ctx-conv-1')
    second = Agent(
        scripted(call('weather', 'call-conv-1', city='Paris'), answer('sunny in Paris')),
        name='chat_agent',
        capabilities=[persistence],
    )

    @second.tool_plain
    def weather(city: str) -> str:
        return f'sunny in {city}'

    await second.run(
        'and the weather in Paris?',
        message_history=result.all_messages(),
        conversation_id='conv-shared',
        run_id='ctx-conv-2',
    )
    return [
        {
            'ctx_run_id': 'ctx-conv-1',
            'derived_agent_name': 'chat',
            'scenario': 'conversation_turn_1',
            'description': 'first run of conversation conv-shared; run_id derived from agent_name and ctx.run_id',
            'outcome': 'completed',
        },
        {
            'ctx_run_id': 'ctx-conv-2',
            'derived_agent_name': 'chat',
            'scenario': 'conversation_turn_2',
            'description': 'second run of conv-shared, continuing the first run history, with one tool cycle',
            'outcome': 'completed',
        },
    ]


async def run_delegation(store: StepStore) -> list[Scenario]:
    researcher = Agent(
        scripted(answer('found 3 papers')),
        name='research_agent',
        capabilities=[StepPersistence(store=store, agent_name='researcher')],
    )
    orchestrator = Agent(
        scripted(call('delegate', 'call-delegate-1', topic='step persistence'), answer('the researcher found 3')),
        name='orchestrator_agent',
        capabilities=[StepPersistence(store=store, run_id='fx-orchestrator', agent_name='orchestrator')],
    )

    @orchestrator.tool_plain
    async def delegate(topic: str) -> str:
        result = await researcher.run(f'research {topic}', conversation_id='conv-research', run_id='ctx-delegate-1')
        return result.output

    await orchestrator.run('plan the work', conversation_id='conv-orchestrator', run_id='ctx-orchestrator')
    return [
        {
            'run_id': 'fx-orchestrator',
            'ctx_run_id': 'ctx-orchestrator',
            'scenario': 'orchestrator',
            'description': 'explicit run_id; its tool runs the delegate agent',
            'outcome': 'completed',
        },
        {
            'ctx_run_id': 'ctx-delegate-1',
            'derived_agent_name': 'researcher',
            'scenario': 'delegate',
            'description': 'delegate run; parent_run_id inferred from the enclosing run, run_id derived',
            'outcome': 'completed',
        },
    ]


async def run_pruned(store: StepStore) -> list[Scenario]:
    agent = Agent(
        scripted(
            call('step', 'call-pruned-1', n=1),
            call('step', 'call-pruned-2', n=2),
            call('step', 'call-pruned-3', n=3),
            answer('three steps done'),
        ),
        name='pruned_agent',
        capabilities=[StepPersistence(store=store, run_id='fx-pruned', agent_name='pruner')],
    )

    @agent.tool_plain
    def step(n: int) -> str:
        return f'step {n} done'

    await agent.run('take three steps', conversation_id='conv-pruned', run_id='ctx-pruned')
    return [
        {
            'run_id': 'fx-pruned',
            'ctx_run_id': 'ctx-pruned',
            'scenario': 'pruned',
            'description': 'three tool cycles on a store with max_snapshots_per_run=2: four snapshots saved, two kept',
            'outcome': 'completed',
            'max_snapshots_per_run': 2,
        }
    ]


async def run_first_request_fails(store: StepStore) -> list[Scenario]:
    agent = Agent(
        scripted(RuntimeError('provider unavailable')),
        name='frontier_agent',
        capabilities=[StepPersistence(store=store, run_id='fx-first-request-fails', capture_frontier=True)],
    )
    try:
        await agent.run('first prompt', conversation_id='conv-frontier', run_id='ctx-first-request-fails')
    except RuntimeError:
        pass
    else:
        raise AssertionError('the first request should fail')
    return [
        {
            'run_id': 'fx-first-request-fails',
            'ctx_run_id': 'ctx-first-request-fails',
            'scenario': 'first_request_fails_capture_frontier',
            'description': 'capture_frontier=True and the first model request raises RuntimeError',
            'outcome': 'failed',
        }
    ]


async def run_resumed_fails(store: StepStore) -> list[Scenario]:
    snapshot = await store.latest_snapshot(run_id='fx-finished')
    assert snapshot is not None
    agent = Agent(
        scripted(RuntimeError('provider unavailable')),
        name='fixture_agent',
        capabilities=[StepPersistence(store=store, run_id='fx-resumed-fails')],
    )
    try:
        await agent.run(
            'and beta?', message_history=snapshot.messages, conversation_id='conv-finished', run_id='ctx-resumed-fails'
        )
    except RuntimeError:
        pass
    else:
        raise AssertionError('the resumed request should fail')
    return [
        {
            'run_id': 'fx-resumed-fails',
            'ctx_run_id': 'ctx-resumed-fails',
            'scenario': 'resumed_first_request_fails',
            'description': "continues fx-finished's latest snapshot; the first model request raises RuntimeError",
            'outcome': 'failed',
        }
    ]


async def write_scenarios(store: StepStore, pruning_store: StepStore, backend: str, location: str) -> list[Scenario]:
    """Every scenario, in a fixed order, into one store (the pruned run through a bounded store on the same data)."""
    scenarios: list[Scenario] = []
    scenarios += await run_finished(store)
    scenarios += await run_crashed(backend, location)
    scenarios += await run_tool_failed(store)
    scenarios += await run_media(store)
    scenarios += await run_conversation(store)
    scenarios += await run_delegation(store)
    scenarios += await run_pruned(pruning_store)
    scenarios += await run_first_request_fails(store)
    scenarios += await run_resumed_fails(store)
    return scenarios


async def write_conversation_head(database: Path, store: StepStore, second_run_id: str) -> dict[str, Any]:
    snapshot = await store.latest_snapshot(run_id=second_run_id)
    assert snapshot is not None
    heads = SqliteConversationStore(database=database)
    checkout: dict[str, Any] = {}
    git_checkout = getattr(conversations, 'GitCheckout', None)  # releases before 0.58 record no checkout
    if git_checkout is not None:
        checkout['checkout'] = git_checkout(**CHECKOUT)
    summary = ConversationSummary(
        id='conv-shared',
        workspace='/workspace/demo',
        model=MODEL_NAME,
        outcome='completed',
        run_id=second_run_id,
        **checkout,
    )
    saved = await heads.save(summary=summary, messages=snapshot.messages)
    named = await heads.name(
        source=saved, title='Weather in Paris', subtitle='greeting then a forecast', tags=('weather',)
    )
    assert named
    current = (await heads.get(conversation_id='conv-shared')).summary
    return {
        'id': current.id,
        'revision': current.revision,
        'title': current.title,
        'subtitle': current.subtitle,
        'tags': list(current.tags),
        'title_source': current.title_source,
        'naming_version': current.naming_version,
        'named_revision': current.named_revision,
        'outcome': current.outcome,
        'run_id': current.run_id,
        'message_count': current.message_count,
        'workspace': current.workspace,
        'checkout': CHECKOUT if checkout else None,
        'archived': getattr(current, 'archived_at', None) is not None,
    }
