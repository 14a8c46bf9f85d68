"""A run's family for its page: the runs it was delegated from, its delegation tree, its conversation."""

from __future__ import annotations

from dataclasses import dataclass, field

from stepcore.recovery.standing import standing_of
from stepcore.store.models import RunRecord
from stepcore.store.step_store import StepStore
from stepcore.ui.queries import shown_status

__all__ = ('LINEAGE_LIMIT', 'Lineage', 'LineageNode', 'lineage')

LINEAGE_LIMIT = 200
"""Most runs shown in one lineage tree; a larger family is cut with a note."""


@dataclass(kw_only=True)
class LineageNode:
    record: RunRecord
    status: str
    """The status shown (see `shown_status`)."""
    unresolved: int
    current: bool = False
    running: bool = False
    """A live owner holds the run: its calls still `started` are running, not cut short."""
    children: list[LineageNode] = field(default_factory=list['LineageNode'])


@dataclass(kw_only=True)
class Lineage:
    ancestors: list[RunRecord]
    """The parent, its parent, and so on (nearest first)."""
    tree: LineageNode
    """The delegation tree from the topmost ancestor, with the run marked `current`."""
    siblings: list[RunRecord]
    """The runs of the same conversation, oldest first (the run itself included)."""
    cut: bool = False
    """True when the tree had more than `LINEAGE_LIMIT` runs and was cut."""
    missing_parent: str | None = None
    """A parent run id the store does not have (deleted, or never registered)."""


async def lineage(
    store: StepStore, record: RunRecord, status: str, unresolved: int, *, running: bool = False
) -> Lineage:
    """The run's ancestors, its delegation tree and its conversation; `status`, `unresolved` and `running`
    are the run's own (its page read them already)."""
    ancestors: list[RunRecord] = []
    seen = {record.run_id}
    missing: str | None = None
    parent_id = record.parent_run_id
    while parent_id and parent_id not in seen and len(ancestors) < LINEAGE_LIMIT:
        parent = await store.get_run(run_id=parent_id)
        if parent is None:
            missing = parent_id
            break
        ancestors.append(parent)
        seen.add(parent_id)
        parent_id = parent.parent_run_id
    top = ancestors[-1] if ancestors else record
    budget = [LINEAGE_LIMIT]

    async def node(run: RunRecord, visited: set[str]) -> LineageNode:
        budget[0] -= 1
        if run.run_id == record.run_id:
            made = LineageNode(record=run, status=status, unresolved=unresolved, current=True, running=running)
        else:
            standing = await standing_of(store, run.run_id)
            made = LineageNode(
                record=run,
                status=shown_status(standing),
                unresolved=len(await store.list_unresolved_tool_effects(run_id=run.run_id)),
                running=standing.ownership == 'running',
            )
        visited.add(run.run_id)
        for child in await store.list_runs(parent_run_id=run.run_id):
            if child.run_id in visited or budget[0] <= 0:
                continue
            made.children.append(await node(child, visited))
        return made

    tree = await node(top, set())
    siblings = await store.list_runs(conversation_id=record.conversation_id) if record.conversation_id else [record]
    return Lineage(ancestors=ancestors, tree=tree, siblings=siblings, cut=budget[0] <= 0, missing_parent=missing)
