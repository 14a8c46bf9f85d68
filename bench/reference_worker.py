"""One measurement of the reference library's step persistence, for `bench_reference.py`.

Not run by hand and not in our venv: `bench_reference.py` starts it with the interpreter of a venv
holding pydantic-ai-harness (the reference library) and pydantic-ai. It imports only those two and
the standard library, never stepcore, so the figures are the reference's alone.

    python reference_worker.py concurrency BACKEND RUNS STEPS
        K runs of N steps at once on one store (the workload of `bench_concurrency.py`); prints one
        JSON line: wall seconds, process CPU seconds, p50 and p99 of the hook time per step.
    python reference_worker.py long BACKEND STEPS MARKS WINDOW
        One run of N steps (the workload of `bench_long_run.py`); prints a JSON line at each mark as
        the run passes it (median hook time of the WINDOW steps up to the mark, bytes on disk), so a
        run stopped by the driver's timeout still reports the marks it reached, then a last line
        with the run's process CPU per step. A run stops early, exit status 3, when the disk under
        its store runs low (`MIN_FREE_BYTES`).

BACKEND is `none` (no persistence), `memory`, `sqlite` or `file`: the reference's
`InMemoryStepStore`, `SqliteStepStore(database=...)` and `FileStepStore(directory)` with their
defaults, attached as `StepPersistence(store=...)`.

Hook time is measured as `hook_timer.py` measures ours: the wall time spent inside every hook the
reference's `StepPersistence` implements, store calls awaited there included; for `wrap_run` the
time of the wrapped run is taken out. The reference records tool calls in `before_tool_execute` /
`after_tool_execute` where ours uses `wrap_tool_execute`; both are counted whole.
"""

# pydantic_ai_harness is installed only in the reference venv; in ours its names are unknown to the
# type checker, so the checks that follow from that are off for this file alone.
# pyright: reportMissingImports=false, reportUnknownVariableType=false, reportUnknownMemberType=false
# pyright: reportUnknownArgumentType=false, reportUntypedBaseClass=false

from __future__ import annotations

import asyncio
import gc
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage, UsageLimits
from pydantic_ai_harness.step_persistence import (
    FileStepStore,
    InMemoryStepStore,
    SqliteStepStore,
    StepPersistence,
)

# -- the workload: must stay identical to bench_steps.tool_text / build_agent (bench_reference.py
# -- checks that before it runs) and to the model of bench_long_run.run_once; copied because those
# -- modules import stepcore

TOOL_RETURN_BYTES = 2048
MIN_FREE_BYTES = 5 * 1024**3
"""A long run stops when the disk holding its store has less free space than this (the reference's file
store writes the whole history at every step, so a long run fills a disk quadratically)."""


def tool_text(i: int) -> str:
    return random.Random(i).randbytes(TOOL_RETURN_BYTES // 2).hex()


def build_agent(steps: int, capabilities: list[Any]) -> Agent[None, str]:
    calls = 0

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls <= steps:
            return ModelResponse(parts=[ToolCallPart('fetch', {'i': calls}, tool_call_id=f'call-{calls}')])
        return ModelResponse(parts=[TextPart('done')])

    agent: Agent[None, str] = Agent(FunctionModel(model), capabilities=capabilities)

    @agent.tool_plain
    def fetch(i: int) -> str:  # pyright: ignore[reportUnusedFunction]
        return tool_text(i)

    return agent


# -- hook timing (as hook_timer.TimedPersistence times ours) --------------------------------------

_SIMPLE_HOOKS = (
    'before_run',
    'after_run',
    'on_run_error',
    'after_model_request',
    'on_model_request_error',
    'before_tool_execute',
    'after_tool_execute',
    'on_tool_execute_error',
    'before_node_run',
    'after_node_run',
)


class TimedReference(StepPersistence):
    """The reference's `StepPersistence` recording, per run, the seconds its hooks took in each step."""

    sink: list[list[float]] | None = None

    async def for_run(self, ctx: Any) -> Any:
        run = await super().for_run(ctx)
        steps: list[float] = [0.0]
        run.__dict__['_steps'] = steps
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
        inner = 0.0

        async def timed_handler() -> Any:
            nonlocal inner
            start = time.perf_counter()
            try:
                return await handler()
            finally:
                inner += time.perf_counter() - start

        start = time.perf_counter()
        try:
            return await super().wrap_run(ctx, handler=timed_handler)
        finally:
            self._add(time.perf_counter() - start - inner)


def _timed(name: str) -> Callable[..., Awaitable[Any]]:
    async def hook(self: TimedReference, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await getattr(super(TimedReference, self), name)(*args, **kwargs)
        finally:
            self._add(time.perf_counter() - start)

    hook.__name__ = name
    return hook


# Only the hooks the reference implements: overriding one it leaves to the base class would add work.
for _name in _SIMPLE_HOOKS:
    if _name in StepPersistence.__dict__:
        setattr(TimedReference, _name, _timed(_name))


def percentile(values: list[float], q: float) -> float:
    """The `q`-quantile (0..1) of `values`, nearest rank (as hook_timer.percentile)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


# -- backends ---------------------------------------------------------------------------------


def make_store(name: str, tmp: Path) -> Any:
    if name == 'none':
        return None
    if name == 'memory':
        return InMemoryStepStore()
    if name == 'sqlite':
        return SqliteStepStore(database=tmp / 'runs.db')
    if name == 'file':
        return FileStepStore(tmp / 'runs')
    raise SystemExit(f'unknown backend {name!r}: use none, memory, sqlite or file')


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob('*') if p.is_file())


async def _check_history(store: Any, name: str, runs: int, steps: int) -> None:
    stored = await store.list_runs()
    if len(stored) != runs:
        raise RuntimeError(f'{name}: {len(stored)} runs stored, expected {runs}')
    latest = await store.latest_snapshot(run_id=stored[0].run_id)
    if latest is None or len(latest.messages) < 2 * steps:
        raise RuntimeError(f'{name}: the store lost the history')


# -- the two measurements ----------------------------------------------------------------------


async def concurrency(name: str, runs: int, steps: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix=f'bench-ref-conc-{name}-'))
    try:
        store = make_store(name, tmp)
        capabilities: list[Any] = []
        sink: list[list[float]] = []
        if store is not None:
            timed = TimedReference(store=store)
            timed.sink = sink
            capabilities.append(timed)
            await store.list_runs()  # open the database and create the schema before timing
        agents = [build_agent(steps, capabilities) for _ in range(runs)]
        gc.collect()
        start = time.perf_counter()
        cpu_start = time.process_time()
        results = await asyncio.gather(
            *(agent.run('go', usage_limits=UsageLimits(request_limit=None)) for agent in agents)
        )
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        if any(r.output != 'done' for r in results):
            raise RuntimeError('unexpected output')
        if store is not None:
            await _check_history(store, name, runs, steps)
        per_step = [s for run in sink for s in run]
        if not per_step:
            return {'seconds': seconds, 'cpu': cpu, 'p50': 0.0, 'p99': 0.0}
        return {'seconds': seconds, 'cpu': cpu, 'p50': percentile(per_step, 0.5), 'p99': percentile(per_step, 0.99)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def long_run(name: str, steps: int, marks: list[int], window: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix=f'bench-ref-long-{name}-'))
    try:
        store = make_store(name, tmp)
        if store is None:
            raise SystemExit('the long run measures persistence: use memory, sqlite or file')
        sink: list[list[float]] = []
        timed = TimedReference(store=store)
        timed.sink = sink
        calls = 0

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            nonlocal calls
            calls += 1
            if calls - 1 in marks:
                # Steps 1..calls-1 are finished: report the mark now, in case the run is stopped later.
                chunk = sink[0][max(0, calls - 1 - window) : calls - 1]
                size = _dir_size(tmp) if name in ('sqlite', 'file') else None
                print(json.dumps({'mark': calls - 1, 'median': statistics.median(chunk), 'bytes': size}), flush=True)
            if shutil.disk_usage(tmp).free < MIN_FREE_BYTES:
                print(json.dumps({'stopped': 'disk nearly full', 'step': calls - 1}), flush=True)
                raise SystemExit(3)
            usage = RequestUsage(input_tokens=10, output_tokens=5)
            if calls <= steps:
                return ModelResponse(parts=[ToolCallPart('fetch', {'i': calls}, tool_call_id=f'c{calls}')], usage=usage)
            return ModelResponse(parts=[TextPart('done')], usage=usage)

        agent: Agent[None, str] = Agent(FunctionModel(model), capabilities=[timed])

        @agent.tool_plain
        def fetch(i: int) -> str:  # pyright: ignore[reportUnusedFunction]
            return tool_text(i)

        await store.list_runs()
        cpu = time.process_time()
        result = await agent.run('go', usage_limits=UsageLimits(request_limit=None))
        cpu = time.process_time() - cpu
        if result.output != 'done':
            raise RuntimeError('unexpected output')
        await _check_history(store, name, 1, steps)
        return {'cpu_per_step': cpu / steps}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> None:
    usage = (
        'usage: reference_worker.py concurrency BACKEND RUNS STEPS | '
        'reference_worker.py long BACKEND STEPS MARKS WINDOW (MARKS comma-separated)'
    )
    if len(argv) == 4 and argv[0] == 'concurrency':
        out = asyncio.run(concurrency(argv[1], int(argv[2]), int(argv[3])))
    elif len(argv) == 5 and argv[0] == 'long':
        marks = [int(m) for m in argv[3].split(',')]
        out = asyncio.run(long_run(argv[1], int(argv[2]), marks, int(argv[4])))
    else:
        raise SystemExit(usage)
    print(json.dumps(out), flush=True)


if __name__ == '__main__':
    main(sys.argv[1:])
