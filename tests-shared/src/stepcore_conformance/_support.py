"""Fixtures and helpers shared by every section of the kit."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias, cast

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from stepcore import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    StepStore,
)

from ._declared import declared, feature_gate, needs_feature, require_feature_declared

__all__ = (
    'T0',
    'Damage',
    'StoreFixtures',
    'at',
    'canonical',
    'conversation',
    'declared',
    'history_step',
    'needs_feature',
    'new_id',
    'options',
    'other_store',
    'register',
    'reply',
    'require_feature_declared',
    'snapshot',
    'tool_exchange',
    'tool_return_content',
    'user',
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
"""Base of every timestamp the kit writes, so expected values are deterministic."""

OptionsParam = dict[str, Any] | Callable[[], dict[str, Any]]


def at(seconds: float) -> datetime:
    """`T0` plus `seconds` (microsecond precision is kept on purpose: stores must round-trip it)."""
    return T0 + timedelta(seconds=seconds)


def options(*params: OptionsParam) -> pytest.MarkDecorator:
    """Parametrize the `store_options` fixture: each param is a dict or a zero-argument factory of one."""
    ids = [_options_id(p) for p in params]
    return pytest.mark.parametrize('store_options', list(params), indirect=True, ids=ids)


def _options_id(param: OptionsParam) -> str:
    if callable(param):
        return getattr(param, '__name__', 'options')
    return ','.join(f'{k}={v!r}' for k, v in param.items()) or 'defaults'


Damage: TypeAlias = Callable[[StepStore, str, str, int | str | None, bytes], Awaitable[None]]
"""The `damage` fixture's callable: `damage(store, kind, run_id, ident, replacement)` (see `DamageConformance`)."""


class StoreFixtures:
    """The fixtures every `StepStore` section uses.

    A backend overrides `store` (required), and `store_spec` and `damage` (optional);
    `store_options` is set by the kit per test.
    """

    @pytest.fixture
    def store_options(self, request: pytest.FixtureRequest) -> dict[str, Any]:
        """Constructor options the kit asks for (e.g. `max_snapshots_per_run`); `{}` by default."""
        param = cast(OptionsParam, getattr(request, 'param', {}))
        return param() if callable(param) else dict(param)

    @pytest.fixture
    async def store(self, store_options: dict[str, Any]) -> AsyncIterator[StepStore]:
        """Override this: yield a fresh, empty store built with `**store_options`, close it afterwards."""
        pytest.fail(
            f'{type(self).__name__} must override the `store` fixture: an async fixture taking `store_options` '
            'that yields a new empty StepStore built with **store_options (see the stepcore-conformance README)'
        )
        return cast(StepStore, None)  # pragma: no cover

    @pytest.fixture
    def stepcore_feature_gate(self, request: pytest.FixtureRequest) -> None:
        """Skip a `needs_feature` test the store does not declare; fail one it declares but cannot run."""
        feature_gate(request)

    @pytest.fixture
    def store_spec(self) -> dict[str, Any] | None:
        """Override this to enable cross-instance and cross-process tests.

        Return the keyword arguments of `stepcore.from_spec` (including `backend=`) that build
        another store over the same data as the `store` fixture, or `None` (the default). A store
        declaring `persistent` must provide it.
        """
        return None

    @pytest.fixture
    def other_store_spec(self) -> dict[str, Any] | None:
        """Override this to check that another store has another id (`store_identity`).

        Return the keyword arguments of `stepcore.from_spec` (including `backend=`) that build a store
        over other, empty data than the `store` fixture's: another file, folder, table or key prefix,
        database. Clean it up afterwards (yield it from a fixture that does). `None` (the default)
        skips that check, saying so.
        """
        return None

    @pytest.fixture
    def damage(self) -> Damage | None:
        """Override this to enable the damage section: an async callable damaging one stored record.

        `await damage(store, kind, run_id, ident, replacement)` overwrites, in the store's own
        storage (not through the store API), the stored body of one record with `replacement`:
        kind `'run'` (ident `None`), `'event'` (ident: its seq), `'effect'` (ident: the
        tool_call_id), `'snapshot'` (ident: its seq; the header, not the messages) or `'message'`
        (ident: a marker text; every stored message body containing it). `None` by default: the
        damage section then fails for a store declaring `persistent` and is skipped for others.
        """
        return None


@asynccontextmanager
async def other_store(store: StepStore, spec: dict[str, Any] | None) -> AsyncIterator[StepStore]:
    """Another store object over the same data when there is a `store_spec`, else `store` itself."""
    if spec is None:
        yield store
        return
    import stepcore

    other = cast(StepStore, stepcore.from_spec(**spec))
    try:
        yield other
    finally:
        await other.aclose()


def new_id(prefix: str) -> str:
    """A unique, path-safe id, so tests never collide even in a shared database."""
    return f'{prefix}-{uuid.uuid4().hex[:12]}'


async def register(store: StepStore, run_id: str | None = None, **fields: Any) -> str:
    """Register a run (fresh id unless given) and return its id."""
    run_id = run_id or new_id('run')
    fields.setdefault('started_at', at(0))
    await store.register_run(RunRecord(run_id=run_id, **fields))
    return run_id


def event(run_id: str, n: int, **fields: Any) -> StepEvent:
    """A deterministic event numbered `n`."""
    fields.setdefault('kind', EventKind.MODEL_REQUEST_STARTED)
    fields.setdefault('step_index', n)
    fields.setdefault('timestamp', at(n))
    return StepEvent(run_id=run_id, **fields)


def snapshot(
    run_id: str,
    messages: Sequence[ModelMessage],
    step_index: int = 0,
    state: SnapshotState = SnapshotState.COMPLETE,
    **fields: Any,
) -> ContinuableSnapshot:
    """A snapshot of `messages` (the list is passed through, not copied)."""
    fields.setdefault('timestamp', at(step_index))
    return ContinuableSnapshot(
        run_id=run_id, step_index=step_index, state=state, messages=cast(list[ModelMessage], messages), **fields
    )


def user(text: str, n: int = 0) -> ModelRequest:
    """A user request with a fixed timestamp."""
    return ModelRequest(parts=[UserPromptPart(content=text, timestamp=at(n))])


def reply(text: str, n: int = 0) -> ModelResponse:
    """A text response with a fixed timestamp."""
    return ModelResponse(parts=[TextPart(content=text)], model_name='kit-model', timestamp=at(n))


def tool_exchange(n: int, content: Any = None) -> list[ModelMessage]:
    """A tool call and its return, numbered `n`."""
    call_id = f'call-{n}'
    return [
        ModelResponse(
            parts=[ToolCallPart(tool_name='lookup', args={'n': n, 'q': f'query {n}'}, tool_call_id=call_id)],
            model_name='kit-model',
            timestamp=at(n),
        ),
        ModelRequest(
            parts=[
                ToolReturnPart(
                    tool_name='lookup',
                    content=content if content is not None else {'n': n, 'rows': [n, n + 1]},
                    tool_call_id=call_id,
                    timestamp=at(n),
                )
            ]
        ),
    ]


def tool_return_content(message: ModelMessage) -> Any:
    """The content of the tool return that opens `message` (a request, as `tool_exchange` builds it)."""
    assert isinstance(message, ModelRequest)
    part = message.parts[0]
    assert isinstance(part, ToolReturnPart)
    return part.content


def history_step(n: int) -> list[ModelMessage]:
    """The messages one settled tool step adds to a history."""
    return tool_exchange(n)


def conversation(steps: int, *, tag: str = 'kit') -> list[ModelMessage]:
    """A deterministic history: a prompt followed by `steps` tool exchanges."""
    messages: list[ModelMessage] = [user(f'{tag}: start')]
    for n in range(steps):
        messages.extend(tool_exchange(n, content=f'{tag} result {n}'))
    return messages


def canonical(messages: Sequence[ModelMessage]) -> list[ModelMessage]:
    """`messages` after one trip through pydantic-ai's own serializer: what a store must give back.

    For most parts this equals the input; a `BinaryContent` comes back narrowed (e.g. `BinaryImage`)
    with its identifier filled in, exactly as pydantic-ai itself loads it.
    """
    return ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(list(messages)))
