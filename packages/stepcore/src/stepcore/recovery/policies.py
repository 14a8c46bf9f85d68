"""Recovery policies: how a tool call cut short by a crash is settled when its run is resumed.

A policy is declared on the tool's function with `recovery_policy`, or given for a tool by name to
`resolve_run(policies=...)` (for tools you do not define, such as an MCP server's):

- `'rerun'`: the call is safe to run again (idempotent, or deduplicated downstream by the
  idempotency key the tool derives from its arguments, which a re-run receives unchanged);
- a reconcile function: given the ledger entry (`ToolEffectRecord`: tool name, arguments,
  idempotency key, effect summary) it asks the outside world whether the effect happened and
  returns `Reconciled(result)` to use as the call's result, or `None` when it did not happen (the
  call then runs);
- `'ask'` (the default): nothing automatic; the call is returned to the caller to settle.

An agent's `StepPersistence(default_recovery_policy=...)` gives the policy of its tools that declare
none.

The policy lives on the function, not in pydantic-ai's `Tool.metadata`, because a tool's metadata
travels in its `ToolDefinition` into every model request's parameters, which durable execution
engines serialize; a reconcile function cannot be serialized.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypeVar, cast

from pydantic_ai import Agent
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from stepcore.capability.persistence import step_persistences
from stepcore.store.models import ToolEffectRecord

__all__ = (
    'POLICY_ATTRIBUTE',
    'Reconcile',
    'Reconciled',
    'RecoveryPolicy',
    'default_policy',
    'policy_for',
    'recovery_policy',
    'undeclared',
)

POLICY_ATTRIBUTE = '__stepcore_recovery_policy__'
"""The attribute `recovery_policy` sets on a tool's function."""


@dataclass(frozen=True)
class Reconciled:
    """What a reconcile function returns when the effect did happen: the result the call gets."""

    result: Any
    """The value the model receives as the call's return, as if the tool had returned it."""


Reconcile: TypeAlias = Callable[[ToolEffectRecord], 'Reconciled | None | Awaitable[Reconciled | None]']
"""A reconcile function: `Reconciled(result)` when the effect happened, `None` when it did not."""

RecoveryPolicy: TypeAlias = "Literal['rerun', 'ask'] | Reconcile"
"""How a call cut short by a crash is settled on resume: `'rerun'`, `'ask'` or a reconcile function."""

F = TypeVar('F', bound=Callable[..., Any])

_NAMED = ('rerun', 'ask')


def check_policy(policy: object, *, tool: str | None = None) -> RecoveryPolicy:
    """`policy` if it is one, else a `ValueError` naming it and the choices."""
    if policy in _NAMED or (callable(policy) and not isinstance(policy, str)):
        return cast(RecoveryPolicy, policy)
    where = f' for tool {tool!r}' if tool is not None else ''
    raise ValueError(f"recovery policy{where} must be 'rerun', 'ask' or a reconcile function; got {policy!r}")


def recovery_policy(policy: RecoveryPolicy) -> Callable[[F], F]:
    """Declare how a call of the decorated tool is settled when its run is resumed after a crash.

    Put it under pydantic-ai's tool decorator, so the function carries it when the tool is made:

        @agent.tool
        @recovery_policy('rerun')
        async def add_label(ctx: RunContext[None], issue: int, label: str) -> str: ...

    `policy` is `'rerun'`, `'ask'` or a reconcile function (see `stepcore.recovery.policies`).
    """
    checked = check_policy(policy)

    def mark(function: F) -> F:
        setattr(function, POLICY_ATTRIBUTE, checked)
        return function

    return mark


def _declared(agent: Agent[Any, Any]) -> dict[str, RecoveryPolicy]:
    """The policies declared on the functions of the agent's function tools, by tool name."""
    found: dict[str, RecoveryPolicy] = {}

    def visit(toolset: AbstractToolset[Any]) -> None:
        if isinstance(toolset, FunctionToolset):
            for name, tool in toolset.tools.items():
                policy = getattr(tool.function, POLICY_ATTRIBUTE, None)
                if policy is not None:
                    found[name] = cast(RecoveryPolicy, policy)

    for toolset in agent.toolsets:
        toolset.apply(visit)
    return found


def default_policy(agent: Agent[Any, Any] | None) -> RecoveryPolicy:
    """The policy of the agent's tools that declare none: its `StepPersistence(default_recovery_policy=...)`,
    else `'ask'`."""
    attached = step_persistences(agent) if agent is not None else []
    chosen = next((p.default_recovery_policy for p in attached if p.default_recovery_policy is not None), None)
    return 'ask' if chosen is None else check_policy(chosen)


def policy_for(
    agent: Agent[Any, Any] | None, overrides: Mapping[str, RecoveryPolicy] | None = None
) -> Callable[[str], RecoveryPolicy]:
    """A lookup of the policy of a tool by name: `overrides` first, then the agent's tools, then the
    agent's default (`default_policy`), else `'ask'`."""
    declared = _declared(agent) if agent is not None else {}
    given = {name: check_policy(policy, tool=name) for name, policy in (overrides or {}).items()}
    table: dict[str, RecoveryPolicy] = {**declared, **given}
    fallback = default_policy(agent)

    def lookup(name: str) -> RecoveryPolicy:
        return table.get(name, fallback)

    return lookup


def undeclared(
    agent: Agent[Any, Any] | None, tools: Sequence[str], overrides: Mapping[str, RecoveryPolicy] | None = None
) -> list[str]:
    """Those of `tools` with no policy of their own, in `overrides` or on the agent's tools (they fall to
    the agent's default, `'ask'` unless set)."""
    declared = {**(_declared(agent) if agent is not None else {}), **(overrides or {})}
    return sorted({name for name in tools if name not in declared})


async def reconcile(function: Reconcile, entry: ToolEffectRecord) -> Reconciled | None:
    """Call a reconcile function (sync or async) on `entry`; anything but `Reconciled` or `None` is refused."""
    answer: object = function(entry)
    if inspect.isawaitable(answer):
        answer = await cast(Awaitable[object], answer)
    if answer is None or isinstance(answer, Reconciled):
        return answer
    raise TypeError(
        f'reconcile function {getattr(function, "__qualname__", function)!r} returned {answer!r} for tool call '
        f'{entry.tool_call_id!r}: return Reconciled(result) when the effect happened, None when it did not'
    )
