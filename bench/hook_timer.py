"""Time spent inside `StepPersistence`'s hooks, step by step: the latency persistence adds.

`TimedPersistence` is `StepPersistence` with every hook it implements timed (wall clock, so a
store write awaited inside a hook counts, whichever thread does it). For the hooks that wrap
pydantic-ai's own work (`wrap_run`, `wrap_tool_execute`) the time of the wrapped work is taken
out. A step starts at each model request; the time of the hooks before the first request (run
start) and after the last (run end) goes to the first and last step.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from stepcore.capability import StepPersistence

_SIMPLE_HOOKS = (
    'before_run',
    'after_run',
    'on_run_error',
    'before_node_run',
    'after_node_run',
    'after_model_request',
    'on_model_request_error',
)


class TimedPersistence(StepPersistence[Any]):
    """`StepPersistence` recording, per run, the seconds its hooks took in each step."""

    sink: list[list[float]] | None = None
    """Where each run's list of per-step seconds is appended (set on the instance given to agents)."""

    async def for_run(self, ctx: Any) -> StepPersistence[Any]:
        run = await super().for_run(ctx)
        steps: list[float] = [0.0]
        object.__setattr__(run, '_steps', steps)
        if self.sink is not None:
            self.sink.append(steps)
        return run

    def _add(self, seconds: float, *, new_step: bool = False) -> None:
        steps: list[float] = self.__dict__['_steps']
        if new_step and steps[-1] > 0:
            steps.append(0.0)
        steps[-1] += seconds

    async def before_model_request(self, ctx: Any, request_context: Any) -> Any:
        start = time.perf_counter()
        try:
            return await super().before_model_request(ctx, request_context)
        finally:
            self._add(time.perf_counter() - start, new_step=True)

    async def wrap_run(self, ctx: Any, *, handler: Callable[[], Awaitable[Any]]) -> Any:
        return await self._wrapped(super().wrap_run, ctx, handler=handler)

    async def wrap_tool_execute(self, ctx: Any, *, handler: Callable[..., Awaitable[Any]], **kwargs: Any) -> Any:
        return await self._wrapped(super().wrap_tool_execute, ctx, handler=handler, **kwargs)

    async def _wrapped(self, hook: Callable[..., Awaitable[Any]], ctx: Any, *, handler: Any, **kwargs: Any) -> Any:
        inner = 0.0

        async def timed_handler(*args: Any) -> Any:
            nonlocal inner
            start = time.perf_counter()
            try:
                return await handler(*args)
            finally:
                inner += time.perf_counter() - start

        start = time.perf_counter()
        try:
            return await hook(ctx, handler=timed_handler, **kwargs)
        finally:
            self._add(time.perf_counter() - start - inner)


def _timed(name: str) -> Callable[..., Awaitable[Any]]:
    async def hook(self: TimedPersistence, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await getattr(super(TimedPersistence, self), name)(*args, **kwargs)
        finally:
            self._add(time.perf_counter() - start)

    hook.__name__ = name
    return hook


for _name in _SIMPLE_HOOKS:
    setattr(TimedPersistence, _name, _timed(_name))


def percentile(values: list[float], q: float) -> float:
    """The `q`-quantile (0..1) of `values`, nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float('nan')
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]
