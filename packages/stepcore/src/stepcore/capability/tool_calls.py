"""Recording a tool call: its `started` entry before the tool runs, its outcome after, and annotations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import AgentDepsT, RunContext
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from stepcore.capability.context import (
    ActiveToolCall,
    ToolEffectAnnotator,
    active_tool_call,
    inside_tool_call,
    note_tool_attempt,
)
from stepcore.capability.run_state import RunState, describe_error
from stepcore.store.models import EventKind, ToolEffectRecord, ToolEffectStatus, utcnow
from stepcore.store.protocols import StepStoreProtocol

__all__ = ('ToolRaiseWitness', 'annotate_in_flight', 'annotate_tool_effect', 'record_tool_call')

T = TypeVar('T')


@dataclass
class ToolRaiseWitness(WrapperToolset[AgentDepsT]):
    """Wraps the run's toolset to see how the tool itself ended: returned, or raised what.

    pydantic-ai runs every capability's `on_tool_execute_error` inside every `wrap_tool_execute`, so
    what reaches `StepPersistence`'s wrapper is what the error hooks made of the tool's exception:
    converted (a redacting policy), or gone (a substitute result). The toolset sits below every
    capability hook, so what is noted here (see `note_tool_attempt`) is what the tool did.
    """

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[AgentDepsT], tool: ToolsetTool[AgentDepsT]
    ) -> Any:
        try:
            result = await self.wrapped.call_tool(name, tool_args, ctx, tool)
        except Exception as error:
            note_tool_attempt(ctx.tool_call_id, error)
            raise
        note_tool_attempt(ctx.tool_call_id, None)
        return result


async def record_tool_call(
    run: RunState,
    ctx: RunContext[Any],
    call: ToolCallPart,
    capability: ToolEffectAnnotator,
    execute: Callable[[], Awaitable[T]],
) -> T:
    """Run `execute` (the tool, inside the capabilities listed after `StepPersistence`) between its
    ledger entries.

    The `started` entry and event are written before the tool runs. Each exception the tool itself
    raised gets a `tool_call_failed` event naming it (`repr`), whatever the capabilities around the
    call made of it. A call that returns is `completed`, held until a complete snapshot holds its
    result; one that raises anything (`ModelRetry`, a deferral, an error) is `failed`. The entry's
    `error`, and its `effect_summary` unless the tool annotated one, name the exception the tool's
    last run raised: on a `failed` entry that is what the call ended with when the tool itself
    returned (a hook's exception), on a `completed` one it says the result is a substitute an error
    hook returned. A call cut short by cancellation or a crash stays `started`.
    """
    call_id = call.tool_call_id
    now = utcnow()
    record = ToolEffectRecord(
        run_id=run.run_id,
        tool_call_id=call_id,
        tool_name=call.tool_name,
        status=ToolEffectStatus.STARTED,
        started_at=now,
        updated_at=now,
        step_index=ctx.run_step,
        args=call.args_as_dict(),
    )
    event = run.event(
        EventKind.TOOL_CALL_STARTED, discriminator=call_id, tool_name=call.tool_name, tool_call_id=call_id
    )
    stored, _ = await run.writer.write(ctx, record, event, new_call=True)
    run.in_flight[call_id] = cast(ToolEffectRecord, stored)
    active = ActiveToolCall(capability=capability, run_id=run.run_id, tool_call_id=call_id)
    try:
        with inside_tool_call(active):
            result = await execute()
    except Exception as error:
        await _finish(run, ctx, call, ToolEffectStatus.FAILED, active.attempts, describe_error(error))
        raise
    await _finish(run, ctx, call, ToolEffectStatus.COMPLETED, active.attempts)
    return result


async def _finish(
    run: RunState,
    ctx: RunContext[Any],
    call: ToolCallPart,
    status: ToolEffectStatus,
    attempts: list[str | None],
    raised: str | None = None,
) -> None:
    """Record the call's outcome (`raised`: what it ended with, when `failed`) after `attempts`, how each
    run of the tool ended: a `tool_call_failed` event for each exception the tool raised, and one for
    `raised` when the tool's last run returned."""
    call_id = call.tool_call_id
    current = run.in_flight.pop(call_id)
    now = utcnow()
    last = attempts[-1] if attempts else None
    errors = [text for text in attempts if text is not None]
    if last is None and raised is not None:
        errors.append(raised)
    error = last if last is not None else raised
    update: dict[str, Any] = {'status': status, 'error': error, 'updated_at': now, 'ended_at': now}
    if current.effect_summary is None and error is not None:
        update['effect_summary'] = error
    finished = current.model_copy(update=update)
    failures = [
        run.event(
            EventKind.TOOL_CALL_FAILED,
            discriminator=call_id,
            tool_name=call.tool_name,
            tool_call_id=call_id,
            error=text,
        )
        for text in errors
    ]
    if status is ToolEffectStatus.COMPLETED:
        if failures:
            await run.writer.defer(ctx, *failures)
        event = run.event(
            EventKind.TOOL_CALL_COMPLETED, discriminator=call_id, tool_name=call.tool_name, tool_call_id=call_id
        )
        run.writer.hold(finished, event)
    else:
        await run.writer.defer(ctx, finished, *failures)


async def annotate_in_flight(
    run: RunState,
    ctx: RunContext[Any],
    store: StepStoreProtocol,
    tool_call_id: str,
    *,
    idempotency_key: str | None,
    effect_summary: str | None,
) -> None:
    """Merge annotations into the in-flight entry of `tool_call_id` and write it (to `store`).

    The merged entry is kept, so the call's terminal entry carries the annotations too. Nothing
    happens when the call is not in flight.
    """
    current = run.in_flight.get(tool_call_id)
    if current is None:
        return
    update: dict[str, Any] = {}
    if idempotency_key is not None:
        update['idempotency_key'] = idempotency_key
    if effect_summary is not None:
        update['effect_summary'] = effect_summary
    merged = current.model_copy(update=update)
    if store is run.writer.store:
        (stored,) = await run.writer.write(ctx, merged.model_copy(update={'updated_at': utcnow()}))
        run.in_flight[tool_call_id] = cast(ToolEffectRecord, stored)
    else:
        run.in_flight[tool_call_id] = merged
        await store.record_tool_effect(merged.model_copy(update={'updated_at': utcnow()}))


async def annotate_tool_effect(
    store: StepStoreProtocol,
    ctx: RunContext[Any],
    *,
    idempotency_key: str | None = None,
    effect_summary: str | None = None,
) -> None:
    """Attach how to deduplicate, and what, a tool's side effect is to its in-flight ledger entry.

    Call it from inside a tool, before doing the side effect. The fields are merged into the
    `started` record of this tool call and kept when the call's terminal record is written. Outside
    a tool call wrapped by `StepPersistence` it does nothing.
    """
    active = active_tool_call()
    if active is None or ctx.tool_call_id is None or active.tool_call_id != ctx.tool_call_id:
        return
    await active.capability.annotate(
        ctx, store, active.tool_call_id, idempotency_key=idempotency_key, effect_summary=effect_summary
    )
