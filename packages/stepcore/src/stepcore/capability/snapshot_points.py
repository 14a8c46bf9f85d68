"""When `StepPersistence` saves a snapshot, and of which history: one function per point of a run.

Each returns the history to save (a new list, never the live one), or `None` when there is
nothing to save at that point.
"""

from __future__ import annotations

from typing import Any, cast

from pydantic_ai import CallToolsNode, ModelRequestNode
from pydantic_ai.capabilities.abstract import AgentNode, NodeResult
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import RunContext

from stepcore.capability.run_state import RunState

__all__ = ('accepted_requests', 'at_failure', 'final_history', 'proposed_calls', 'settled_tool_cycle')


def _has_response(messages: list[ModelMessage]) -> bool:
    # a loop, not `any` over a generator (one frame fewer): called at every node
    for message in messages:  # noqa: SIM110
        if isinstance(message, ModelResponse):
            return True
    return False


def settled_tool_cycle(
    run: RunState, ctx: RunContext[Any], node: AgentNode[Any], result: NodeResult[Any]
) -> list[ModelMessage] | None:
    """After a tool cycle whose calls are all answered (or the final tool-less response): `complete`.

    When another model request follows, the tool returns are in that request, not yet in the
    live history: they are folded in.
    """
    if not isinstance(node, CallToolsNode):
        return None
    if isinstance(result, ModelRequestNode):
        request = result.request  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        messages: list[ModelMessage] = [*ctx.messages, cast(ModelMessage, request)]
    else:
        messages = list(ctx.messages)
    return messages if _has_response(messages) and run.settled.is_provider_valid(messages) else None


def proposed_calls(run: RunState, ctx: RunContext[Any], node: AgentNode[Any]) -> list[ModelMessage] | None:
    """Before tools execute (with `capture_frontier`): the response proposing them, `interrupted`."""
    if not isinstance(node, CallToolsNode):
        return None
    response = node.model_response
    if not any(isinstance(part, ToolCallPart) for part in response.parts):
        return None
    messages = list(ctx.messages)
    if not messages or messages[-1] is not response:
        messages.append(response)
    return messages if run.content.differs(messages) else None


def accepted_requests(run: RunState, ctx: RunContext[Any]) -> list[ModelMessage] | None:
    """Before a model request (with `capture_frontier`): the history about to be sent, `interrupted`.

    The request folded into the last tool-cycle snapshot, now stamped for sending, is not new.
    """
    messages = list(ctx.messages)
    if messages and not run.content.same_objects(messages) and run.content.differs(messages):
        return messages
    return None


def final_history(run: RunState, result: AgentRunResult[Any]) -> list[ModelMessage] | None:
    """At the end of a run, when the final history differs from the newest snapshot.

    That is `run_stream`'s closing response, a rewrite by another capability, or a run that never
    reached a boundary.
    """
    final = list(result.all_messages())
    return final if final and run.content.differs(final) else None


def at_failure(run: RunState, *, capture_frontier: bool) -> list[ModelMessage] | None:
    """When the run fails: the history to resume from, once it holds a model response.

    That is the live history as it stood, unless the run failed before any node after its user
    prompt finished (its first model request raised): then it is the history the run was given,
    without the new prompt that no model answered, so a caller who resumes from it and sends the
    prompt again does not send it twice. With `capture_frontier` a history without a model
    response is saved too (a fresh run's own prompt is already in the snapshot taken before the
    request).
    """
    if run.progressed or run.given is None:
        messages = list(run.live) if run.live is not None else []
    else:
        messages = list(run.given)
    return messages if messages and (capture_frontier or _has_response(messages)) else None
