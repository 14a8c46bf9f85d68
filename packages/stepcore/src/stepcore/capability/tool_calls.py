"""Recording a tool call: its `started` entry before the tool runs, its outcome after, and annotations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import RunContext

from stepcore.capability.context import ActiveToolCall, ToolEffectAnnotator, active_tool_call, inside_tool_call
from stepcore.capability.run_state import RunState, describe_error
from stepcore.store.models import EventKind, ToolEffectRecord, ToolEffectStatus, utcnow
from stepcore.store.protocols import StepStoreProtocol

__all__ = ('annotate_in_flight', 'annotate_tool_effect', 'record_tool_call')

T = TypeVar('T')


async def record_tool_call(
    run: RunState,
    ctx: RunContext[Any],
    call: ToolCallPart,
    capability: ToolEffectAnnotator,
    execute: Callable[[], Awaitable[T]],
) -> T:
    """Run `execute` (the tool) between its ledger entries.

    The `started` entry and event are written before the tool runs. A call that returns is
    `completed`, held until a complete snapshot holds its result; one that raises anything
    (`ModelRetry`, a deferral, an error) is `failed` with the exception's type and message in
    `error`, and its `repr` in `effect_summary` unless the tool annotated a summary. A call cut
    short by cancellation or a crash stays `started`.
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
    try:
        with inside_tool_call(ActiveToolCall(capability=capability, run_id=run.run_id, tool_call_id=call_id)):
            result = await execute()
    except Exception as error:
        await _finish(run, ctx, call, ToolEffectStatus.FAILED, error=describe_error(error), summary=repr(error))
        raise
    await _finish(run, ctx, call, ToolEffectStatus.COMPLETED)
    return result


async def _finish(
    run: RunState,
    ctx: RunContext[Any],
    call: ToolCallPart,
    status: ToolEffectStatus,
    *,
    error: str | None = None,
    summary: str | None = None,
) -> None:
    """Record the call's outcome; `summary` fills `effect_summary` when the tool did not annotate one."""
    call_id = call.tool_call_id
    current = run.in_flight.pop(call_id)
    now = utcnow()
    update: dict[str, Any] = {'status': status, 'error': error, 'updated_at': now, 'ended_at': now}
    if current.effect_summary is None and summary is not None:
        update['effect_summary'] = summary
    finished = current.model_copy(update=update)
    if status is ToolEffectStatus.COMPLETED:
        event = run.event(
            EventKind.TOOL_CALL_COMPLETED, discriminator=call_id, tool_name=call.tool_name, tool_call_id=call_id
        )
        run.writer.hold(finished, event)
    else:
        event = run.event(
            EventKind.TOOL_CALL_FAILED,
            discriminator=call_id,
            tool_name=call.tool_name,
            tool_call_id=call_id,
            error=error,
        )
        await run.writer.defer(ctx, finished, event)


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
