"""Turning stored records into tables, trees and readable message transcripts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from pydantic_ai.messages import (
    BinaryContent,
    FileUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from stepcore.recovery.jobs import JobRun
from stepcore.store.leases import Lease, LeaseState
from stepcore.store.lifecycle import run_status as lifecycle_status
from stepcore.store.models import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus

__all__ = (
    'RunNode',
    'effects_table',
    'events_table',
    'render_messages',
    'run_status',
    'run_tree',
    'runs_table',
    'snapshots_table',
    'when',
)

_STATUS_STYLE = {'completed': 'green', 'failed': 'red', 'unfinished': 'yellow', 'waiting': 'cyan'}
_EFFECT_STYLE = {
    ToolEffectStatus.COMPLETED: 'green',
    ToolEffectStatus.FAILED: 'red',
    ToolEffectStatus.STARTED: 'yellow',
}


def run_status(events: Sequence[StepEvent]) -> str:
    """`completed`, `failed`, `unfinished` (still running, or the process died) or `waiting` from a run's events."""
    return lifecycle_status(events)


def styled_status(status: str) -> Text:
    return Text(status, style=_STATUS_STYLE.get(status, ''))


def _dash(value: object) -> Text:
    """A stored value as plain text (never read as markup), `-` when there is none."""
    return Text('-' if value is None or value == '' else str(value))


def _table(title: str | None) -> Table:
    """A table whose title, which may name a run, is shown as plain text."""
    return Table(title=None if title is None else Text(title, style='table.title'))


def when(moment: datetime) -> str:
    """A moment as `YYYY-MM-DD HH:MM:SS` in UTC."""
    return _when(moment)


def _when(moment: datetime) -> str:
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime('%Y-%m-%d %H:%M:%S')


def _clip(text: str, limit: int = 200) -> str:
    text = text.replace('\r', '')
    return text if len(text) <= limit else text[: limit - 1] + '…'


def runs_table(
    runs: Sequence[RunRecord], statuses: Sequence[str], *, title: str | None = None, timestamps: bool = True
) -> Table:
    table = _table(title)
    table.add_column('run_id', overflow='fold')
    table.add_column('agent', overflow='fold')
    table.add_column('status', no_wrap=True)
    table.add_column('conversation', overflow='fold')
    table.add_column('parent', overflow='fold')
    if timestamps:
        table.add_column('started_at (UTC)')
    for run, status in zip(runs, statuses, strict=True):
        row: list[RenderableType] = [
            Text(run.run_id),
            _dash(run.agent_name),
            styled_status(status),
            _dash(run.conversation_id),
            _dash(run.parent_run_id),
        ]
        if timestamps:
            row.append(_when(run.started_at))
        table.add_row(*row)
    return table


def events_table(events: Sequence[StepEvent], *, title: str | None = None, timestamps: bool = True) -> Table:
    table = _table(title)
    with_errors = any(e.error for e in events)
    table.add_column('seq', justify='right')
    table.add_column('step', justify='right')
    table.add_column('kind', no_wrap=True)
    table.add_column('tool', overflow='fold')
    table.add_column('tool_call_id', overflow='fold')
    if with_errors:
        table.add_column('error', overflow='fold')
    if timestamps:
        table.add_column('timestamp (UTC)', no_wrap=True)
    for event in events:
        style = 'red' if event.kind.value.endswith('_failed') else ''
        row: list[RenderableType] = [
            _dash(event.seq),
            str(event.step_index),
            Text(event.kind.value, style=style),
            _dash(event.tool_name),
            _dash(event.tool_call_id),
        ]
        if with_errors:
            row.append(Text(_clip(event.error or '-', 80)))
        if timestamps:
            row.append(_when(event.timestamp))
        table.add_row(*row)
    return table


def snapshots_table(
    snapshots: Sequence[ContinuableSnapshot], *, title: str | None = None, timestamps: bool = True
) -> Table:
    table = _table(title)
    table.add_column('seq', justify='right')
    table.add_column('step', justify='right')
    table.add_column('state', no_wrap=True)
    table.add_column('messages', justify='right')
    table.add_column('last message', overflow='fold')
    if timestamps:
        table.add_column('created_at (UTC)', no_wrap=True)
    for snap in snapshots:
        state_style = 'green' if snap.state.value == 'complete' else 'yellow'
        row: list[RenderableType] = [
            _dash(snap.seq),
            str(snap.step_index),
            Text(snap.state.value, style=state_style),
            str(len(snap.messages)),
            Text(_last_message_summary(snap.messages)),
        ]
        if timestamps:
            row.append(_when(snap.timestamp))
        table.add_row(*row)
    return table


def _last_message_summary(messages: Sequence[ModelMessage]) -> str:
    if not messages:
        return '-'
    last = messages[-1]
    kinds = ', '.join(p.part_kind for p in last.parts) or 'no parts'
    return f'{last.kind}: {kinds}'


def effects_table(
    effects: Sequence[ToolEffectRecord], *, title: str | None = None, timestamps: bool = True, compact: bool = False
) -> Table:
    table = _table(title)
    with_errors = any(e.error for e in effects)
    table.add_column('tool_call_id', overflow='fold')
    table.add_column('tool', overflow='fold')
    table.add_column('status', no_wrap=True)
    if not compact:
        table.add_column('step', justify='right')
    table.add_column('idempotency_key', overflow='fold')
    if not compact:
        table.add_column('effect_summary', overflow='fold')
    if with_errors:
        table.add_column('error', overflow='fold')
    if timestamps:
        table.add_column('updated_at (UTC)', no_wrap=True)
    for effect in effects:
        row: list[RenderableType] = [
            Text(effect.tool_call_id),
            Text(effect.tool_name),
            Text(effect.status.value, style=_EFFECT_STYLE.get(effect.status, '')),
        ]
        if not compact:
            row.append(str(effect.step_index))
        row.append(_dash(effect.idempotency_key))
        if not compact:
            row.append(_dash(effect.effect_summary))
        if with_errors:
            row.append(Text(_clip(effect.error or '-', 80)))
        if timestamps:
            row.append(_when(effect.updated_at or effect.started_at))
        table.add_row(*row)
    return table


class RunNode:
    """A run and its delegates, for the tree view."""

    def __init__(self, record: RunRecord, status: str, unresolved: int, children: list[RunNode]) -> None:
        self.record = record
        self.status = status
        self.unresolved = unresolved
        self.children = children

    def label(self) -> Text:
        text = Text()
        text.append(self.record.run_id, style='bold')
        agent = self.record.agent_name or '?'
        text.append(f'  [{agent}]  ')
        text.append_text(styled_status(self.status))
        if self.unresolved:
            plural = 's' if self.unresolved != 1 else ''
            text.append(f'  {self.unresolved} unresolved tool effect{plural}', style='yellow')
        return text

    def as_json(self) -> dict[str, Any]:
        return {
            'run_id': self.record.run_id,
            'agent_name': self.record.agent_name,
            'conversation_id': self.record.conversation_id,
            'status': self.status,
            'unresolved_tool_effects': self.unresolved,
            'children': [c.as_json() for c in self.children],
        }


def run_tree(root: RunNode) -> Tree:
    tree = Tree(root.label())

    def add(branch: Tree, node: RunNode) -> None:
        for child in node.children:
            add(branch.add(child.label()), child)

    add(tree, root)
    return tree


def _args_text(part: ToolCallPart) -> str:
    args = part.args
    if args is None:
        return '{}'
    if isinstance(args, str):
        try:
            return json.dumps(json.loads(args), ensure_ascii=False)
        except ValueError:
            return args
    return json.dumps(args, ensure_ascii=False, default=str)


def _size(n: int) -> str:
    return f'{n} bytes' if n < 1024 else f'{n / 1024:.1f} KiB'


def _item_text(item: object) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, BinaryContent):
        binary: Any = item  # a pydantic dataclass, which type checkers see only as such
        return f'[{binary.media_type}, {_size(len(binary.data))}]'
    if isinstance(item, FileUrl):
        link: Any = item
        return f'[{link.url}]'
    return f'<{type(item).__name__}>'


def _content_text(content: Any) -> str:
    if isinstance(content, str | BinaryContent | FileUrl):
        return _item_text(content)
    if isinstance(content, Iterable) and not isinstance(content, bytes | dict):
        items = cast(Iterable[object], content)
        return ' '.join(_item_text(item) for item in items)
    value = cast(object, content)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _grid() -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=1)
    grid.add_column(no_wrap=True, min_width=11)
    grid.add_column(overflow='fold', ratio=1)
    return grid


def _row(grid: Table, label: str, style: str, body: str) -> None:
    grid.add_row('', Text(label, style=style), Text(_clip(body, 400)))


def render_messages(messages: Sequence[ModelMessage]) -> Group:
    """Each message with its parts: prompts, tool calls with their arguments, returns and text."""
    blocks: list[RenderableType] = []
    for index, message in enumerate(messages):
        grid = _grid()
        if isinstance(message, ModelRequest):
            blocks.append(Text(f'[{index}] request', style='bold cyan'))
            if message.instructions:
                _row(grid, 'instructions', 'dim', message.instructions)
            for part in message.parts:
                if isinstance(part, SystemPromptPart):
                    _row(grid, 'system', 'dim', part.content)
                elif isinstance(part, UserPromptPart):
                    _row(grid, 'user', 'bold', _content_text(part.content))
                elif isinstance(part, ToolReturnPart):
                    body = f'{part.tool_name} ({part.tool_call_id}) -> {_content_text(part.content)}'
                    _row(grid, 'tool return', 'green', body)
                elif part.part_kind in ('retry-prompt', 'retry-feedback'):
                    _row(grid, 'retry', 'yellow', _content_text(getattr(part, 'content', '')))
                else:
                    _row(grid, part.part_kind, 'dim', _content_text(getattr(part, 'content', '')))
        else:
            assert isinstance(message, ModelResponse)
            model = f' ({message.model_name})' if message.model_name else ''
            blocks.append(Text(f'[{index}] response{model}', style='bold magenta'))
            for part in message.parts:
                if isinstance(part, TextPart):
                    _row(grid, 'text', '', part.content)
                elif isinstance(part, ToolCallPart):
                    body = f'{part.tool_name}({_args_text(part)})  id={part.tool_call_id}'
                    _row(grid, 'tool call', 'blue', body)
                elif isinstance(part, ThinkingPart):
                    _row(grid, 'thinking', 'dim', part.content)
                else:
                    _row(grid, part.part_kind, 'dim', _content_text(getattr(part, 'content', '')))
        if grid.row_count:
            blocks.append(grid)
    if not blocks:
        blocks.append(Text('  (no messages)', style='dim'))
    return Group(*blocks)


def lease_json(lease: Lease) -> dict[str, Any]:
    """A lease for `--json` output (fields with nothing to say are left out where they are new)."""
    data: dict[str, Any] = {
        'epoch': lease.epoch,
        'state': lease.state.value,
        'owner': lease.owner.to_json() if lease.owner is not None else None,
        'expires_at': lease.expires_at.isoformat(),
        'checked_at': lease.checked_at.isoformat(),
        'resumes': lease.resumes,
        'resumed_by': lease.resumed_by,
        'outcome': lease.outcome,
        'note': lease.note,
    }
    if lease.version is not None:
        data['version'] = lease.version
    if lease.job is not None:
        data['job'] = lease.job
    if lease.died:
        data['died'] = [attempt.to_json() for attempt in lease.died]
    return data


def job_table(runs: Sequence[JobRun]) -> Table:
    """The runs of a job, oldest first: how each stands and who held it."""
    table = _table(None)
    table.add_column('run_id', overflow='fold')
    table.add_column('status', no_wrap=True)
    table.add_column('lease', overflow='fold')
    table.add_column('epoch', justify='right')
    table.add_column('owner / note', overflow='fold')
    for run in runs:
        lease = run.lease
        if lease is None:
            table.add_row(Text(run.run_id), styled_status(run.status), _dash(None), _dash(None), _dash(None))
            continue
        state = lease.state.value + (f' ({lease.outcome})' if lease.outcome and lease.state is LeaseState.ENDED else '')
        who = str(lease.owner) if lease.owner is not None else lease.note
        table.add_row(Text(run.run_id), styled_status(run.status), Text(state), Text(str(lease.epoch)), _dash(who))
    return table
