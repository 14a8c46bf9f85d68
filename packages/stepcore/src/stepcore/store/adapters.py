"""`list_runs` of stepcore's signature over a `list_runs` of the reference's.

The reference's protocol (pydantic-ai-harness's `StepStore`) lists runs by lineage only:
`list_runs(*, parent_run_id=None, conversation_id=None)`. A store written to it, switched to
stepcore by changing its imports, still answers every call stepcore makes: `StepStore.__init_subclass__`
wraps a subclass's own `list_runs` of that signature (`paged`), and `ProtocolStore` does the same
for a store that keeps the protocol without the base class (`paged_list_runs`). The store filters
by lineage; the other filters, the order and the paging are applied over its answer.

Nothing here knows the base class: a store is reached through `RunStatuses`, the one hook the
filters need, so the base class imports this module and not the other way round.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeAlias, cast

from stepcore.store.lifecycle import RunKey, RunQuery, RunStatus, collect_runs, sort_time
from stepcore.store.models import RunRecord

__all__ = ('RunStatuses', 'paged', 'paged_list_runs', 'takes_keywords')


class RunStatuses(Protocol):
    """What filtering by status needs of a store: the status of one run (`StepStore._status_of`)."""

    async def _status_of(self, run_id: str) -> RunStatus: ...


def takes_keywords(method: Callable[..., object], *names: str) -> bool:
    """Whether an override accepts every one of `names` as keywords (by name or through `**kwargs`)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return True  # no signature to read: call it as the contract says
    return all(n in params for n in names) or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


ListRunsByLineage: TypeAlias = Callable[..., Awaitable[list[RunRecord]]]
"""A store's `list_runs(self, *, parent_run_id=None, conversation_id=None)`: the reference's signature."""


def paged(owner: str, by_lineage: Callable[..., object]) -> Callable[..., Awaitable[list[RunRecord]]]:
    """`list_runs` of stepcore's signature over an override of the reference's: the store filters by
    lineage, and the other filters, the order and the paging are applied over its answer."""
    reference = cast(ListRunsByLineage, by_lineage)

    async def list_runs(self: RunStatuses, **arguments: Any) -> list[RunRecord]:
        async def by_store(**lineage: str | None) -> list[RunRecord]:
            return await reference(self, **lineage)

        return await paged_list_runs(self, by_store, arguments)

    list_runs.__qualname__ = f'{owner}.list_runs'
    list_runs.__doc__ = by_lineage.__doc__
    return list_runs


async def paged_list_runs(
    store: RunStatuses, by_lineage: Callable[..., Awaitable[list[RunRecord]]], arguments: Mapping[str, Any]
) -> list[RunRecord]:
    """`list_runs(**arguments)` of stepcore's signature, answered by `by_lineage`, a `list_runs` that
    takes only `conversation_id` and `parent_run_id` (the reference's): the other filters, the order
    and the paging are applied over its answer."""
    query = RunQuery.make(**arguments)
    if set(arguments) <= {'conversation_id', 'parent_run_id'}:
        # the reference's call shape: the store's own answer, with runs of one instant put in run_id order
        return _ties_by_run_id(list(await by_lineage(**arguments)))

    async def fetch(after: RunKey | None, batch: int | None) -> tuple[list[RunRecord], bool, RunKey | None]:
        del after, batch  # the reference's signature answers every run of the lineage at once
        found = await by_lineage(conversation_id=query.conversation_id, parent_run_id=query.parent_run_id)
        return list(found), True, None

    return await collect_runs(query, fetch, store._status_of)  # pyright: ignore[reportPrivateUsage]


def _ties_by_run_id(runs: list[RunRecord]) -> list[RunRecord]:
    """`runs` in their order, except that neighbours with the same `started_at` go in `run_id` order."""
    ordered: list[RunRecord] = []
    start = 0
    while start < len(runs):
        end = start + 1
        while end < len(runs) and sort_time(runs[end].started_at) == sort_time(runs[start].started_at):
            end += 1
        ordered.extend(sorted(runs[start:end], key=lambda r: r.run_id))
        start = end
    return ordered
