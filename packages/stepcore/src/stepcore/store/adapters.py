"""Adapters for a store written to the earlier signatures of `list_runs` and `list_snapshots`.

`StepStore.__init_subclass__` installs them on a subclass whose own method takes fewer arguments
than the contract now passes; `paged_list_runs` also serves a store written to the protocol alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from stepcore.store.lifecycle import RunKey, RunQuery, collect_runs, sort_time
from stepcore.store.models import ContinuableSnapshot, RunRecord, SnapshotState

if TYPE_CHECKING:
    from stepcore.store.step_store import StepStore

__all__ = ('filtered', 'paged', 'paged_list_runs', 'takes_include_interrupted', 'takes_keywords')


ListAll: TypeAlias = Callable[[Any, str], Awaitable[list[ContinuableSnapshot]]]
"""A store's `list_snapshots(self, run_id)` of the earlier signature: every snapshot of the run."""


def takes_include_interrupted(method: Callable[..., object]) -> bool:
    """Whether a `list_snapshots` override accepts `include_interrupted=` (by name or through `**kwargs`)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return True  # no signature to read: call it as the contract says
    return 'include_interrupted' in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def takes_keywords(method: Callable[..., object], *names: str) -> bool:
    """Whether an override accepts every one of `names` as keywords (by name or through `**kwargs`)."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return True
    return all(n in params for n in names) or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


ListRunsByLineage: TypeAlias = Callable[..., Awaitable[list[RunRecord]]]
"""A store's `list_runs(self, *, conversation_id=None, parent_run_id=None)` of the earlier signature."""


def paged(owner: str, by_lineage: Callable[..., object]) -> Callable[..., Awaitable[list[RunRecord]]]:
    """`list_runs` of the current signature over an override of the earlier one: the store filters by
    lineage, and the other filters, the order and the paging are applied over its answer."""
    earlier = cast(ListRunsByLineage, by_lineage)

    async def list_runs(self: StepStore, **arguments: Any) -> list[RunRecord]:
        return await paged_list_runs(self, lambda **lineage: earlier(self, **lineage), arguments)

    list_runs.__qualname__ = f'{owner}.list_runs'
    list_runs.__doc__ = by_lineage.__doc__
    return list_runs


async def paged_list_runs(
    store: StepStore, by_lineage: Callable[..., Awaitable[list[RunRecord]]], arguments: Mapping[str, Any]
) -> list[RunRecord]:
    """`list_runs(**arguments)` of the current signature, answered by `by_lineage`, a `list_runs` that
    takes only `conversation_id` and `parent_run_id` (the reference's): the other filters, the order
    and the paging are applied over its answer."""
    query = RunQuery.make(**arguments)
    if set(arguments) <= {'conversation_id', 'parent_run_id'}:
        # the earlier call shape: the store's own answer, with runs of one instant put in run_id order
        return _ties_by_run_id(list(await by_lineage(**arguments)))

    async def fetch(after: RunKey | None, batch: int | None) -> tuple[list[RunRecord], bool, RunKey | None]:
        del after, batch  # the earlier signature answers every run of the lineage at once
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


def filtered(owner: str, list_all: Callable[..., object]) -> Callable[..., Awaitable[list[ContinuableSnapshot]]]:
    """`list_snapshots` of the current signature over an override of the earlier one, which answers
    every snapshot: the complete ones are kept unless `include_interrupted=True`."""
    every = cast(ListAll, list_all)

    async def list_snapshots(self: Any, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        found = await every(self, run_id)
        if include_interrupted:
            return found
        return [s for s in found if SnapshotState(s.state) is SnapshotState.COMPLETE]

    list_snapshots.__qualname__ = f'{owner}.list_snapshots'
    list_snapshots.__doc__ = list_all.__doc__
    return list_snapshots
