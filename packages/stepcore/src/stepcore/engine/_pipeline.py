"""Helpers for async ports over a network: pipelined reads and message node ids taken in blocks.

- `PipelinedPort`: an `AsyncPort` whose reads are *asks*: for an operation it can send beside
  others it defines `ask_<method>(op)` (`ask_get_run`, `ask_list_snapshots`, ...) answering an
  `Ask`: the request in the port's own form (a statement and its parameters, a list of commands)
  and how the replies become the operation's answer. The port implements `pipeline(tx, requests)`,
  which sends requests together and answers their replies in order. Then a group of independent
  reads (`run_group`) costs one round trip, and one operation with an ask needs no method of its
  own.
- `NodeIdBlocks`: message node ids reserved from the backend's counter a block at a time and
  handed out from memory, so storing a snapshot rarely waits for an id.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from stepcore.engine import _ops as ops
from stepcore.engine._port import AsyncPort

__all__ = ('Ask', 'NodeIdBlocks', 'PipelinedPort')

T = TypeVar('T')

NODE_ID_BLOCK = 128
"""Message node ids a port reserves at a time by default."""


@dataclass(frozen=True, slots=True)
class Ask(Generic[T]):
    """A read a port can send beside others: `request` in the port's own form, and `answer`, which
    turns the request's reply (what `PipelinedPort.pipeline` answers for it) into the operation's
    answer."""

    request: Any
    answer: Callable[[Any], T]


class PipelinedPort(AsyncPort):
    """An `AsyncPort` that sends reads together (see the module docstring)."""

    async def pipeline(self, tx: Any, requests: Sequence[Any]) -> Sequence[Any]:
        """Send `requests` (each an `Ask.request`) together, in one round trip where the backend
        can; their replies, in order."""
        raise NotImplementedError(f'{type(self).__name__} does not implement pipeline')

    def ask(self, op: ops.Op) -> Ask[Any] | None:
        """The port's `ask_<method>(op)` for this operation, or `None` when it has none."""
        make: Callable[[ops.Op], Ask[Any]] | None = getattr(self, f'ask_{op.method}', None)
        return make(op) if make is not None else None

    async def fetch(self, tx: Any, ask: Ask[T]) -> T:
        """The answer of one ask."""
        (reply,) = await self.pipeline(tx, (ask.request,))
        return ask.answer(reply)

    async def run(self, tx: Any, op: ops.Op) -> Any:
        """Carry out one operation: through its ask when the port has one, else its method."""
        ask = self.ask(op)
        if ask is None:
            return await super().run(tx, op)
        return await self.fetch(tx, ask)

    async def run_group(self, tx: Any, ops: Sequence[ops.Op]) -> list[Any]:
        """Independent reads in one `pipeline` call when every one has an ask; else one at a time."""
        asks = [self.ask(op) for op in ops]
        if any(ask is None for ask in asks):
            return await super().run_group(tx, ops)
        ready = [ask for ask in asks if ask is not None]
        replies = await self.pipeline(tx, [ask.request for ask in ready])
        return [ask.answer(reply) for ask, reply in zip(ready, replies, strict=True)]


class NodeIdBlocks:
    """Message node ids reserved from a backend's counter `block` at a time, handed out from memory.

    Every store object keeps blocks of its own, so ids are unique across objects and processes (the
    counter hands each block out once) but not consecutive between them, which `PutSnapshot` allows.
    """

    def __init__(self, block: int = NODE_ID_BLOCK) -> None:
        if block < 1:
            raise ValueError(f'block={block!r} cannot reserve node ids: use 1 or more')
        self.block = block
        self._spare: list[int] = []

    async def take(self, count: int, reserve: Callable[[int], Awaitable[Sequence[int]]]) -> list[int]:
        """`count` unused ids; `reserve(n)` takes `n` new ids from the backend's counter when too few
        are left (it may run more than once: concurrent saves of this store may take ids meanwhile)."""
        spare = self._spare
        while len(spare) < count:
            spare.extend(await reserve(count - len(spare) + self.block))
        taken = spare[:count]
        del spare[:count]
        return taken
