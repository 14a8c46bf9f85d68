"""A run and the runs it delegated to, as a tree: how each stands, and what of its ledger is unresolved."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from rich.tree import Tree

from stepcore.cli.cells import styled_status
from stepcore.store.models import RunRecord

__all__ = ('RunNode', 'run_tree')


class RunNode:
    """A run and its delegates, for the tree view."""

    def __init__(
        self,
        record: RunRecord,
        status: str,
        unresolved: int,
        children: list[RunNode],
        *,
        running: bool = False,
        resumed_by: str | None = None,
    ) -> None:
        self.record = record
        self.status = status
        self.unresolved = unresolved
        self.children = children
        self.running = running
        """A live owner holds the run: its calls still `started` are running, not cut short."""
        self.resumed_by = resumed_by
        """The run that resumed it, if any."""

    def label(self) -> Text:
        text = Text()
        text.append(self.record.run_id, style='bold')
        agent = self.record.agent_name or '?'
        text.append(f'  [{agent}]  ')
        if self.resumed_by is not None and self.status == 'waiting':  # its pause is over: another run carried on
            text.append(f'resumed by {self.resumed_by}', style='green')
        else:
            text.append_text(styled_status(self.status))
        if self.unresolved:
            plural = 's' if self.unresolved != 1 else ''
            if self.running:
                text.append(f'  {self.unresolved} tool call{plural} running', style='cyan')
            else:
                text.append(f'  {self.unresolved} unresolved tool effect{plural}', style='yellow')
        return text

    def as_json(self) -> dict[str, Any]:
        return {
            'run_id': self.record.run_id,
            'agent_name': self.record.agent_name,
            'conversation_id': self.record.conversation_id,
            'status': self.status,
            'unresolved_tool_effects': self.unresolved,
            'running': self.running,
            'resumed_by': self.resumed_by,
            'children': [c.as_json() for c in self.children],
        }


def run_tree(root: RunNode) -> Tree:
    tree = Tree(root.label())

    def add(branch: Tree, node: RunNode) -> None:
        for child in node.children:
            add(branch.add(child.label()), child)

    add(tree, root)
    return tree
