"""The subclass section: a subclass of the backend's store, with private attributes of its own, keeps working.

Users subclass a store to add what their application needs (a `ping`, a purge, a connection helper
of their own) and set their own private attributes in `__init__`: `self._driver`, `self._db`,
`self._client`. Names a store uses for its own state must never collide with those, before or after
`super().__init__`. The kit builds a subclass of the class the `store` fixture builds, whose
`__init__` sets `COMMON_PRIVATE_NAMES` to objects of its own, once after `super().__init__` and once
before it, and then checks that:

- the subclass still passes the contract section (`ContractConformance`);
- it runs an agent whose history continues in a second run, and a run cut short inside a tool call
  is resolved (`resolve_run`) and resumed to the end;
- every name it set still holds its own object at the end: the store neither overwrote nor used it.

The subclass is built with the arguments the `store` fixture built its store with (read off that
construction, so the fixture is the backend's usual one): a second store over the same data. A
store that is not a `StepStore` subclass (a class written to the reference's protocol) owns its
state and is skipped with that reason. `media_subclass.py` does the
same for media stores built on `stepcore.media.MediaEngine`.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import AsyncIterator, Iterator
from types import FrameType
from typing import Any, Literal, cast

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo

from stepcore import (
    EventKind,
    StepPersistence,
    StepStore,
    ToolEffectStatus,
    continue_run,
    inspect_recovery,
    is_provider_valid,
    resolve_run,
)

from ._support import StoreFixtures, new_id
from .capability import function_model, tool_call
from .contract import ContractConformance

__all__ = (
    'COMMON_PRIVATE_NAMES',
    'ConstructionRecorder',
    'SubclassConformance',
    'assert_names_kept',
    'colliding_subclass',
    'subclass_recorder',
    'subclassed',
)

COMMON_PRIVATE_NAMES = (
    '_driver',
    '_db',
    '_conn',
    '_connection',
    '_client',
    '_pool',
    '_lock',
    '_path',
    '_media_store',
    '_store',
    '_rows',
    '_history',
    '_handle',
    '_closed',
    '_tables',
    '_query',
    '_sealer',
    '_worker',
)
"""Private names a subclass of a store plausibly sets for itself (and that stores have used for theirs)."""

Mode = Literal['after', 'before']
_MARK = '__stepcore_colliding__'


class Foreign:
    """An object a subclass keeps under one of its private names: nothing a store could use."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f'<the subclass own {self.name}>'


def _set_names(instance: object) -> None:
    for name in COMMON_PRIVATE_NAMES:
        setattr(instance, name, Foreign(name))


_subclasses: dict[tuple[type, Mode], type] = {}


def colliding_subclass(cls: type, mode: Mode) -> type:
    """A subclass of `cls` whose `__init__` sets `COMMON_PRIVATE_NAMES` after (or before) `super().__init__`."""
    found = _subclasses.get((cls, mode))
    if found is not None:
        return found

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if mode == 'before':
            _set_names(self)
        super(subclass, self).__init__(*args, **kwargs)
        if mode == 'after':
            _set_names(self)

    subclass = type(f'Colliding{cls.__name__}', (cls,), {'__init__': __init__, '__module__': __name__, _MARK: mode})
    _subclasses[(cls, mode)] = subclass
    return subclass


class ConstructionRecorder:
    """Notes the arguments each new instance of `base` was built with, while it is on (`sys.setprofile`).

    The first `__init__` a new instance runs is its class's own, called with the arguments given to the
    class: they are read off that call's frame, so the same store can be built again as a subclass.
    """

    def __init__(self, base: type) -> None:
        self.base = base
        self.calls: dict[int, tuple[object, tuple[Any, ...], dict[str, Any]]] = {}
        self._previous: Any = None
        self._on = False

    def start(self) -> None:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        self._on = True

    def stop(self) -> None:
        if self._on:
            sys.setprofile(self._previous)
            self._on = False

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if event != 'call' or code.co_name != '__init__' or not code.co_argcount:
            return
        params = frame.f_locals
        instance = params.get(code.co_varnames[0])
        # type(), not isinstance(): an object half way through its __init__ may not answer __class__
        if not issubclass(type(instance), self.base) or id(instance) in self.calls:
            return
        positional = code.co_varnames[1 : code.co_argcount]
        keyword = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
        rest = code.co_argcount + code.co_kwonlyargcount
        args: list[Any] = [params[name] for name in positional]
        kwargs: dict[str, Any] = {name: params[name] for name in keyword}
        if code.co_flags & inspect.CO_VARARGS:
            args.extend(params[code.co_varnames[rest]])
            rest += 1
        if code.co_flags & inspect.CO_VARKEYWORDS:
            kwargs.update(params[code.co_varnames[rest]])
        self.calls[id(instance)] = (instance, tuple(args), kwargs)

    def arguments_of(self, instance: object) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The arguments `instance` was built with, or `None` when it was not built while recording."""
        found = self.calls.get(id(instance))
        return None if found is None or found[0] is not instance else (found[1], found[2])


def subclass_recorder(base: type) -> Iterator[ConstructionRecorder]:
    """A fixture body: record constructions of `base` from now until the fixture using it stops the recorder."""
    recorder = ConstructionRecorder(base)
    recorder.start()
    try:
        yield recorder
    finally:
        recorder.stop()


def subclassed(recorder: ConstructionRecorder, built: object, mode: Mode, fixture: str) -> Any:
    """A new store like `built` (the value of `fixture`), built as its colliding subclass with the same arguments."""
    recorder.stop()
    base = recorder.base
    cls = type(built)
    if base not in cls.__mro__:
        pytest.skip(
            f'{cls.__name__} is not a {base.__name__} subclass: it keeps its own state, and the kit can only '
            f'subclass a {base.__name__} (rebuilding it with the arguments the `{fixture}` fixture gave it)'
        )
    arguments = recorder.arguments_of(built)
    if arguments is None:
        pytest.fail(
            f'the `{fixture}` fixture returned a {cls.__name__} that was not built while the fixture ran: build a '
            f'new store inside the fixture (the kit rebuilds it as a subclass with the same arguments)'
        )
    args, kwargs = arguments
    return colliding_subclass(cls, mode)(*args, **kwargs)


def assert_names_kept(instance: object) -> None:
    """Every name the colliding subclass set still holds its own object."""
    changed = {
        name: getattr(instance, name, '<deleted>')
        for name in COMMON_PRIVATE_NAMES
        if not (isinstance(getattr(instance, name, None), Foreign) and getattr(instance, name).name == name)
    }
    assert not changed, (
        f'{type(instance).__name__} replaced private attributes its subclass set for itself: {changed}. '
        'Keep a store own state in name-mangled attributes (self.__name), which a subclass cannot reach by accident'
    )


def _prompted(message: ModelRequest) -> bool:
    return any(isinstance(p, UserPromptPart) for p in message.parts)


def _turn_start(messages: list[ModelMessage]) -> int:
    """Where the newest turn starts: the last request carrying a user prompt."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, ModelRequest) and _prompted(message):
            return index
    return 0


def _returned(messages: list[ModelMessage]) -> set[str]:
    return {p.tool_call_id for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}


def _notes_agent(store: StepStore, writes: list[str], *, block: asyncio.Event | None = None, **options: Any) -> Agent:
    """An agent that reads, then writes a note, then answers; with `block`, the write hangs once it has begun."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        start = _turn_start(messages)
        turn = sum(isinstance(m, ModelRequest) and _prompted(m) for m in messages[: start + 1])
        returned = _returned(messages[start:])
        if f'write-{turn}' in returned:
            return ModelResponse(parts=[TextPart(f'noted after {len(writes)} write(s)')])
        if f'read-{turn}' in returned:
            return ModelResponse(parts=[tool_call('write', f'write-{turn}', text='call ana')])
        return ModelResponse(parts=[tool_call('read', f'read-{turn}')])

    agent = Agent(function_model(respond), capabilities=[StepPersistence(store=store, **options)])

    @agent.tool_plain
    def read() -> str:  # pyright: ignore[reportUnusedFunction]
        return 'no notes yet'

    @agent.tool_plain
    async def write(text: str) -> str:  # pyright: ignore[reportUnusedFunction]
        writes.append(text)
        if block is not None:
            block.set()
            await asyncio.Event().wait()  # cut short here by cancelling the run
        return 'noted'

    return agent


class SubclassConformance(StoreFixtures):
    """A subclass of the store that sets `COMMON_PRIVATE_NAMES` for itself passes the contract and runs agents."""

    @pytest.fixture
    def step_store_constructions(self) -> Iterator[ConstructionRecorder]:
        """Records how the `store` fixture builds its store (requested before it)."""
        yield from subclass_recorder(StepStore)

    @pytest.fixture(params=['after', 'before'], ids=['names-set-after-init', 'names-set-before-init'])
    async def subclassed_store(
        self, request: pytest.FixtureRequest, step_store_constructions: ConstructionRecorder, store: StepStore
    ) -> AsyncIterator[StepStore]:
        """A store built like the `store` fixture's, as its colliding subclass (closed afterwards)."""
        built = cast(StepStore, subclassed(step_store_constructions, store, request.param, 'store'))
        yield built
        await built.aclose()

    async def test_a_subclass_with_private_names_of_its_own_keeps_the_contract(
        self, subclassed_store: StepStore
    ) -> None:
        assert_names_kept(subclassed_store)
        for name, test in sorted(vars(ContractConformance).items()):
            if name.startswith('test_'):
                await test(self, subclassed_store)
        assert_names_kept(subclassed_store)

    async def test_a_subclass_with_private_names_of_its_own_continues_and_recovers_runs(
        self, subclassed_store: StepStore
    ) -> None:
        store = subclassed_store
        conversation_id = new_id('conv')
        writes: list[str] = []
        first = await _notes_agent(store, writes).run('note: call ana', conversation_id=conversation_id)
        assert first.output == 'noted after 1 write(s)'
        history = await continue_run(store, run_id=first.run_id)
        assert is_provider_valid(history)
        assert history == first.all_messages()

        # The next turn starts from the stored history, and is cut short inside its write.
        crashed = new_id('crashed')
        began = asyncio.Event()
        cut = asyncio.create_task(
            _notes_agent(store, writes, block=began, run_id=crashed).run(
                'and again', message_history=history, conversation_id=conversation_id
            )
        )
        await asyncio.wait_for(began.wait(), 60)
        cut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cut
        assert writes == ['call ana', 'call ana']
        unresolved = await store.list_unresolved_tool_effects(run_id=crashed)
        assert [(e.tool_name, e.tool_call_id, e.status) for e in unresolved] == [
            ('write', 'write-2', ToolEffectStatus.STARTED)
        ]
        report = await inspect_recovery(store=store, run_id=crashed)
        assert [e.tool_call_id for e in report.unresolved] == ['write-2']

        agent = _notes_agent(store, writes)
        resumption = await resolve_run(store, run_id=crashed, agent=agent, policies={'write': 'rerun'})
        assert [(s.tool_call_id, s.how) for s in resumption.settled] == [('write-2', 'rerun')]
        assert resumption.ready
        resumed = await resumption.run(agent, conversation_id=conversation_id)
        assert resumed.output == 'noted after 3 write(s)'
        kinds = [e.kind for e in await store.list_events(run_id=resumed.run_id)]
        assert kinds[-1] is EventKind.RUN_COMPLETED
        assert is_provider_valid(await continue_run(store, run_id=resumed.run_id))
        settled = await store.get_tool_effect(run_id=crashed, tool_call_id='write-2')
        assert settled is not None
        assert settled.status is ToolEffectStatus.COMPLETED
        runs = [r.run_id for r in await store.list_runs(conversation_id=conversation_id)]
        assert runs == [first.run_id, crashed, resumed.run_id]
        assert_names_kept(store)
