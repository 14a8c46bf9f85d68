"""What the store says about a failing tool does not depend on the capabilities around it.

pydantic-ai runs every capability's `on_tool_execute_error` inside every `wrap_tool_execute`, so a
policy listed anywhere can convert a tool's exception or replace it with a substitute result before
`StepPersistence`'s wrapper sees the outcome. The ledger and the event trail still name the
exception the tool itself raised (its `repr`, as the reference records it), with a `tool_call_failed`
event for every time the tool raised. Each case runs with the other capability listed before
`StepPersistence` (outside it) and after it (inside).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pytest
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.capabilities import AbstractCapability, CapabilityOrdering
from pydantic_ai.capabilities.abstract import WrapToolExecuteHandler
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.tools import ToolDefinition

from stepcore import (
    EventKind,
    InMemoryStepStore,
    StepPersistence,
    ToolEffectStatus,
    inspect_recovery,
)
from stepcore_conformance.capability import RedactingPolicy, SubstitutingPolicy, function_model, script, tool_call

Position = Literal['outside', 'inside']
DISK_FULL = "RuntimeError('disk full')"


@dataclass
class RetryingWrapper(AbstractCapability[Any]):
    """Runs the tool's whole lifecycle again when it raises, up to `attempts` times."""

    attempts: int = 2

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        for attempt in range(1, self.attempts + 1):
            try:
                return await handler(args)
            except RuntimeError:
                if attempt == self.attempts:
                    raise
        raise AssertionError('unreachable')


@dataclass
class ResultRejecter(AbstractCapability[Any]):
    """Rejects every tool result after the tool returned it (its own exception, not the tool's)."""

    async def after_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: dict[str, Any], result: Any
    ) -> Any:
        raise ModelRetry('result rejected')


def _agent(
    store: InMemoryStepStore, other: AbstractCapability[Any], position: Position, *, fails: int = 1_000
) -> tuple[Agent[None, str], list[int]]:
    """An agent whose tool `ship` raises `RuntimeError('disk full')` its first `fails` times, with
    `other` listed outside or inside `StepPersistence`; and the list counting the tool's runs."""
    persistence = StepPersistence(store=store, run_id='r')
    capabilities = [other, persistence] if position == 'outside' else [persistence, other]
    agent = Agent(
        function_model(script(ModelResponse(parts=[tool_call('ship', 'c1')]), ModelResponse(parts=[TextPart('done')]))),
        capabilities=capabilities,
    )
    runs: list[int] = []

    @agent.tool_plain
    def ship() -> str:  # pyright: ignore[reportUnusedFunction]
        runs.append(1)
        if len(runs) <= fails:
            raise RuntimeError('disk full' if len(runs) == 1 else f'disk full {len(runs)}')
        return 'shipped'

    return agent, runs


async def _tool_trail(store: InMemoryStepStore) -> list[tuple[EventKind, str | None]]:
    return [(e.kind, e.error) for e in await store.list_events('r') if e.tool_call_id == 'c1']


def _sent_to_model(messages: list[ModelMessage]) -> str:
    return ' '.join(str(getattr(p, 'content', '')) for m in messages if isinstance(m, ModelRequest) for p in m.parts)


@pytest.mark.parametrize('position', ['outside', 'inside'])
async def test_a_converted_error_is_recorded_as_the_tool_raised_it(position: Position) -> None:
    store = InMemoryStepStore()
    policy = RedactingPolicy(message='Tool failed (redacted)')
    agent, _ = _agent(store, policy, position)
    result = await agent.run('ship it')
    assert 'Tool failed (redacted)' in _sent_to_model(result.all_messages())  # the model saw the policy's

    entry = await store.get_tool_effect('r', 'c1')
    assert entry is not None
    assert (entry.status, entry.error, entry.effect_summary) == (ToolEffectStatus.FAILED, DISK_FULL, DISK_FULL)
    assert await _tool_trail(store) == [(EventKind.TOOL_CALL_STARTED, None), (EventKind.TOOL_CALL_FAILED, DISK_FULL)]
    report = await inspect_recovery(store=store, run_id='r')
    assert report.failed_tools == ('ship',)


@pytest.mark.parametrize('position', ['outside', 'inside'])
async def test_a_substitute_result_completes_the_call_and_keeps_its_failure(position: Position) -> None:
    store = InMemoryStepStore()
    agent, runs = _agent(store, SubstitutingPolicy(result='from the cache'), position)
    result = await agent.run('ship it')
    assert 'from the cache' in _sent_to_model(result.all_messages())
    assert len(runs) == 1

    entry = await store.get_tool_effect('r', 'c1')
    assert entry is not None
    # As the reference ends it: completed, the tool's exception kept in the summary (and in `error`).
    assert (entry.status, entry.error, entry.effect_summary) == (ToolEffectStatus.COMPLETED, DISK_FULL, DISK_FULL)
    assert await _tool_trail(store) == [
        (EventKind.TOOL_CALL_STARTED, None),
        (EventKind.TOOL_CALL_FAILED, DISK_FULL),
        (EventKind.TOOL_CALL_COMPLETED, None),
    ]
    assert await store.list_unresolved_tool_effects('r') == []


async def test_a_retry_outside_records_each_attempt() -> None:
    store = InMemoryStepStore()
    agent, runs = _agent(store, RetryingWrapper(), 'outside', fails=1)
    assert (await agent.run('ship it')).output == 'done'
    assert len(runs) == 2
    entry = await store.get_tool_effect('r', 'c1')
    assert entry is not None
    # The second attempt is a call of its own to StepPersistence: a fresh entry, which returned.
    assert (entry.status, entry.error, entry.effect_summary) == (ToolEffectStatus.COMPLETED, None, None)
    assert await _tool_trail(store) == [
        (EventKind.TOOL_CALL_STARTED, None),
        (EventKind.TOOL_CALL_FAILED, DISK_FULL),
        (EventKind.TOOL_CALL_STARTED, None),
        (EventKind.TOOL_CALL_COMPLETED, None),
    ]


async def test_a_retry_inside_keeps_the_failed_attempt_in_the_events() -> None:
    store = InMemoryStepStore()
    agent, runs = _agent(store, RetryingWrapper(), 'inside', fails=1)
    assert (await agent.run('ship it')).output == 'done'
    assert len(runs) == 2
    entry = await store.get_tool_effect('r', 'c1')
    assert entry is not None
    # The tool's last run returned its own result: nothing to name on the entry.
    assert (entry.status, entry.error, entry.effect_summary) == (ToolEffectStatus.COMPLETED, None, None)
    assert await _tool_trail(store) == [
        (EventKind.TOOL_CALL_STARTED, None),
        (EventKind.TOOL_CALL_FAILED, DISK_FULL),
        (EventKind.TOOL_CALL_COMPLETED, None),
    ]


async def test_a_retry_inside_that_never_succeeds_names_every_failure() -> None:
    store = InMemoryStepStore()
    agent, runs = _agent(store, RetryingWrapper(attempts=2), 'inside', fails=2)
    with pytest.raises(RuntimeError, match='disk full 2'):
        await agent.run('ship it')
    assert len(runs) == 2
    entry = await store.get_tool_effect('r', 'c1')
    assert entry is not None
    last = "RuntimeError('disk full 2')"
    assert (entry.status, entry.error) == (ToolEffectStatus.FAILED, last)
    assert await _tool_trail(store) == [
        (EventKind.TOOL_CALL_STARTED, None),
        (EventKind.TOOL_CALL_FAILED, DISK_FULL),
        (EventKind.TOOL_CALL_FAILED, last),
    ]


async def test_a_hook_rejecting_a_returned_result_is_the_recorded_failure() -> None:
    store = InMemoryStepStore()
    agent = Agent(
        function_model(
            script(
                ModelResponse(parts=[tool_call('ship', 'c1')]),
                ModelResponse(parts=[tool_call('ship', 'c2')]),
                ModelResponse(parts=[TextPart('done')]),
            )
        ),
        capabilities=[StepPersistence(store=store, run_id='r'), ResultRejecter()],
        retries=3,
    )

    @agent.tool_plain
    def ship() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'shipped'

    await agent.run('ship it')
    entry = await store.get_tool_effect('r', 'c1')
    assert entry is not None
    # The tool returned; what ended the call is the hook's retry request, so that is what is named.
    assert (entry.status, entry.error) == (ToolEffectStatus.FAILED, "ModelRetry('result rejected')")
    assert await _tool_trail(store) == [
        (EventKind.TOOL_CALL_STARTED, None),
        (EventKind.TOOL_CALL_FAILED, "ModelRetry('result rejected')"),
    ]


async def test_a_model_retry_from_the_tool_is_named_as_raised() -> None:
    store = InMemoryStepStore()
    agent = Agent(
        function_model(
            script(
                ModelResponse(parts=[tool_call('ship', 'c1')]),
                ModelResponse(parts=[tool_call('ship', 'c2')]),
                ModelResponse(parts=[TextPart('done')]),
            )
        ),
        capabilities=[StepPersistence(store=store, run_id='r')],
    )
    runs: list[int] = []

    @agent.tool_plain
    def ship() -> str:  # pyright: ignore[reportUnusedFunction]
        runs.append(1)
        if len(runs) == 1:
            raise ModelRetry('try a smaller parcel')
        return 'shipped'

    await agent.run('ship it')
    entry = await store.get_tool_effect('r', 'c1')
    assert entry is not None
    assert (entry.status, entry.error) == (ToolEffectStatus.FAILED, "ModelRetry('try a smaller parcel')")


# --- shaped as a Django agent host's tool-failure policy ----------------------------------------


@dataclass
class ToolFailurePolicy(AbstractCapability[Any]):
    """The outermost capability of an application: a tool's exception reaches the model as a short,
    redacted `ToolFailed`, and the application relies on the step recorder for the real one."""

    seen: list[str]

    def get_ordering(self) -> CapabilityOrdering | None:
        return CapabilityOrdering(position='outermost')

    async def on_tool_execute_error(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        error: Exception,
    ) -> Any:
        self.seen.append(repr(error))
        raise ToolFailed(f'{call.tool_name} failed; the error was logged') from error


async def test_an_outermost_redacting_policy_leaves_the_tools_exception_in_the_store() -> None:
    store = InMemoryStepStore()
    seen: list[str] = []
    # Listed last, placed outermost by its ordering, as such a host installs it.
    agent = Agent(
        function_model(
            script(
                ModelResponse(parts=[tool_call('lookup', 'ok-1'), tool_call('charge', 'c1', amount=5)]),
                ModelResponse(parts=[TextPart('sorry, the charge failed')]),
            )
        ),
        capabilities=[StepPersistence(store=store, run_id='r'), ToolFailurePolicy(seen)],
    )

    @agent.tool_plain
    def lookup() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'customer 7'

    @agent.tool_plain
    def charge(amount: int) -> str:  # pyright: ignore[reportUnusedFunction]
        raise ConnectionError(f'payment gateway refused {amount} (card 4242)')

    result = await agent.run('charge the customer')
    raw = "ConnectionError('payment gateway refused 5 (card 4242)')"
    assert seen == [raw]
    sent = _sent_to_model(result.all_messages())
    assert 'charge failed; the error was logged' in sent
    assert '4242' not in sent  # the model saw only the policy's words

    effects = {e.tool_call_id: e for e in await store.list_tool_effects('r')}
    assert effects['ok-1'].status is ToolEffectStatus.COMPLETED
    assert (effects['c1'].status, effects['c1'].error, effects['c1'].effect_summary) == (
        ToolEffectStatus.FAILED,
        raw,
        raw,
    )
    failed = [e for e in await store.list_events('r') if e.kind is EventKind.TOOL_CALL_FAILED]
    assert [(e.tool_name, e.error) for e in failed] == [('charge', raw)]
    assert all('the error was logged' not in (e.error or '') for e in await store.list_events('r'))
