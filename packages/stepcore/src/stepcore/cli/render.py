"""Turning stored records into tables, trees and readable message transcripts."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
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
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text
from rich.tree import Tree

from stepcore.cli.words import ANSWERED, answer_text, died_text, owner_text
from stepcore.ownership.identity import owner_gone
from stepcore.recovery.jobs import JobRun
from stepcore.recovery.standing import Standing
from stepcore.store.leases import Lease, LeaseState
from stepcore.store.lifecycle import run_status as lifecycle_status
from stepcore.store.models import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.store.waiting import Answer, answer_of

__all__ = (
    'FOLD_FLOOR',
    'Moment',
    'RunNode',
    'Waits',
    'Whole',
    'add_column',
    'effects_table',
    'events_table',
    'fit',
    'render_messages',
    'run_status',
    'run_tree',
    'runs_table',
    'snapshots_table',
    'standing_label',
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


def standing_label(standing: Standing) -> str:
    """How a run stands, for the runs table: `Standing.label`, its leases told from their fields."""
    lease = standing.lease
    ownership = standing.ownership
    if ownership == 'waiting':
        return 'waiting for answers'
    if lease is None or ownership in (None, 'resumed', 'pending'):
        return standing.label
    when = f'{lease.expires_at.astimezone(UTC):%H:%M:%S}'
    if ownership == 'running' and lease.owner is not None:
        doing = 'recovered by' if lease.owner.role == 'recovery' else 'running on'
        return f'{doing} {owner_text(lease.owner)} (lease until {when})'
    if ownership == 'orphaned':
        return 'orphaned (owner gone)' if owner_gone(lease) else f'orphaned (lease expired {when})'
    if ownership == 'dead':
        newest = f'; the newest: {died_text(lease.died[-1])}' if lease.died else ''
        return f'dead: {len(lease.died)} resumptions died{newest}'
    return standing.label


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


# --- fitting a table to the terminal ------------------------------------------------------------------

FOLD_FLOOR = 12
"""The narrowest a column of ids (folded over several lines) is made when a table is fitted to a terminal."""

_WRAP_FLOOR = 4
"""The narrowest any wrapping column is made when a table cannot fit with every column at its floor."""

_measurer: Console | None = None


def _measuring_console() -> Console:
    global _measurer
    if _measurer is None:
        _measurer = Console(file=io.StringIO(), width=100_000, color_system=None, force_terminal=False)
    return _measurer


def _measure(table: Table, column: Column) -> tuple[int, int]:
    """A column's longest word and longest line, header included (content only, no padding)."""
    console = _measuring_console()
    cells: list[RenderableType] = list(column.cells)
    if table.show_header:
        cells.append(column.header)
    words, lines = 1, 1
    for cell in cells:
        measured = Measurement.get(console, console.options, cell)
        words, lines = max(words, measured.minimum), max(lines, measured.maximum)
    return words, lines


def _overhead(table: Table) -> int:
    """The characters a table's borders and cell padding take on each line."""
    count = len(table.columns)
    _, right, _, left = table.padding
    padding = count * (left + right)
    if not table.pad_edge and count:
        padding -= left + right
    if table.collapse_padding and count > 1:
        padding -= (count - 1) * min(left, right)
    borders = 0
    if table.box is not None:
        borders = count - 1 + (2 if table.show_edge else 0)
    return padding + borders


def natural_width(table: Table) -> int:
    """How wide `table` is when none of its cells wraps."""
    return sum(_measure(table, column)[1] for column in table.columns) + _overhead(table)


class Moment(Column):
    """A column of `YYYY-MM-DD HH:MM:SS` moments: on one line when there is room, else date above time."""


class Whole(Column):
    """A column of names a person reads (an agent, an event kind): its words are folded last of all."""


_DATE = 10
"""The width of a moment's date, the narrowest a column of moments is made."""


def add_column(table: Table, column: Column) -> None:
    """Add `column` (a `Moment`, a `Whole` or any `Column`) to `table`, as `Table.add_column` adds its own."""
    column._index = len(table.columns)  # pyright: ignore[reportPrivateUsage]
    table.columns.append(column)


def _floor(column: Column, word: int, line: int) -> int:
    """The narrowest `column` is made while every column keeps its words whole or its ids folded."""
    if column.width is not None:
        return column.width
    if column.no_wrap:
        return line
    if isinstance(column, Moment):
        return min(line, _DATE)
    if isinstance(column, Whole):
        return word
    if column.overflow == 'fold':
        return min(word, FOLD_FLOOR)
    return word


def _shrink(widths: list[int], floors: Sequence[int], excess: int) -> int:
    """Take `excess` characters from the widest columns first, none below its floor; what is left."""
    while excess > 0:
        room = [i for i, width in enumerate(widths) if width > floors[i]]
        if not room:
            break
        widest = max(room, key=lambda i: (widths[i], widths[i] - floors[i]))
        widths[widest] -= 1
        excess -= 1
    return excess


def fit(table: Table, width: int) -> Table:
    """Give `table`'s columns widths that fit in `width` characters, wrapping cells rather than cutting them.

    A table that fits is left as it is. Otherwise the widest columns give way first, each down to its
    longest word at most (a column of ids, folded over lines, down to `FOLD_FLOOR`; one that never
    wraps, such as a status word, not at all), so no cell loses words while the terminal has room for
    them; only a terminal too narrow for that cuts cells short.
    """
    columns = table.columns
    if not columns:
        return table
    measured = [_measure(table, column) for column in columns]
    widths = [
        column.width if column.width is not None else line for column, (_, line) in zip(columns, measured, strict=True)
    ]
    excess = sum(widths) + _overhead(table) - width
    if excess <= 0:
        return table
    floors = [_floor(column, word, line) for column, (word, line) in zip(columns, measured, strict=True)]
    # Words stay whole while they can: ids fold only once the other columns are down to their longest
    # words. Moments keep to one line till then too; past that, each goes to two lines at once.
    whole = [
        line if isinstance(column, Moment) else max(floor, word)
        for column, floor, (word, line) in zip(columns, floors, measured, strict=True)
    ]
    if sum(whole) + _overhead(table) > width:
        for index, column in enumerate(columns):
            if isinstance(column, Moment):
                widths[index] = whole[index] = floors[index]
        excess = sum(widths) + _overhead(table) - width
    excess = _shrink(widths, whole, excess)
    excess = _shrink(widths, floors, excess)
    if excess > 0:  # too narrow for every word: wrapping columns go further, to a few characters
        excess = _shrink(
            widths, [f if c.no_wrap else min(f, _WRAP_FLOOR) for c, f in zip(columns, floors, strict=True)], excess
        )
    if excess > 0:
        _shrink(widths, [1] * len(widths), excess)
    for column, new in zip(columns, widths, strict=True):
        column.width = new
    return table


def _fitted(wide: Table, compact: Callable[[], Table], width: int | None) -> Table:
    """`wide` when it fits in `width` (or no width is given), else `compact()` fitted to it."""
    if width is None or natural_width(wide) <= width:
        return wide
    return fit(compact(), width)


def _lines(first: str, *labelled: tuple[str, object], style: str = '') -> Text:
    """A cell of several lines: `first`, then `label value` for each value there is (labels dim)."""
    text = Text(first, style=style)
    for label, value in labelled:
        if value is None or value == '':
            continue
        text.append(f'\n{label} ', style='dim')
        text.append(str(value))
    return text


def _time_column(table: Table, header: str) -> None:
    """A column of `YYYY-MM-DD HH:MM:SS` moments: on one line when there is room, else date above time."""
    add_column(table, Moment(header))


# --- the tables ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Waits:
    """What a run waiting on deferred tool calls waits for, for the `runs --status waiting` table."""

    unanswered: int
    """Calls with no answer yet (and not past their deadline)."""
    calls: int
    """Every deferred call of the pause."""
    deadline: datetime | None
    """The earliest deadline of the unanswered calls (`None`: none has one)."""

    def calls_text(self) -> str:
        if not self.calls:
            return '-'
        if not self.unanswered:
            return 'none: all answered'
        if self.unanswered == self.calls:
            return f'{self.calls} call{"" if self.calls == 1 else "s"}'
        return f'{self.unanswered} of {self.calls} calls'

    def deadline_text(self) -> str:
        return '-' if self.deadline is None else _when(self.deadline)


def runs_table(
    runs: Sequence[RunRecord],
    statuses: Sequence[str],
    *,
    title: str | None = None,
    timestamps: bool = True,
    waits: Sequence[Waits | None] | None = None,
    width: int | None = None,
) -> Table:
    """The runs, one a row: id, agent, status, conversation, parent, start, and with `waits` what each
    waiting run waits for. Narrower than its natural width, the conversation and parent go under the
    run id, and the other cells wrap."""

    def wide() -> Table:
        table = _table(title)
        table.add_column('run_id', overflow='fold')
        table.add_column('agent', overflow='fold')
        table.add_column('status', no_wrap=True)
        table.add_column('conversation', overflow='fold')
        table.add_column('parent', overflow='fold')
        if timestamps:
            table.add_column('started_at (UTC)')
        _waits_columns(table, waits)
        for index, (run, status) in enumerate(zip(runs, statuses, strict=True)):
            row: list[RenderableType] = [
                Text(run.run_id),
                _dash(run.agent_name),
                styled_status(status),
                _dash(run.conversation_id),
                _dash(run.parent_run_id),
            ]
            if timestamps:
                row.append(_when(run.started_at))
            row.extend(_waits_cells(waits, index))
            table.add_row(*row)
        return table

    def compact() -> Table:
        table = _table(title)
        table.add_column('run_id', overflow='fold')
        add_column(table, Whole('agent', overflow='fold'))
        table.add_column('status', overflow='fold')
        if timestamps:
            _time_column(table, 'started_at (UTC)')
        _waits_columns(table, waits, compact=True)
        for index, (run, status) in enumerate(zip(runs, statuses, strict=True)):
            row: list[RenderableType] = [
                _lines(run.run_id, ('conversation', run.conversation_id), ('parent', run.parent_run_id)),
                _dash(run.agent_name),
                styled_status(status),
            ]
            if timestamps:
                row.append(_when(run.started_at))
            row.extend(_waits_cells(waits, index))
            table.add_row(*row)
        return table

    return _fitted(wide(), compact, width)


def _waits_columns(table: Table, waits: Sequence[Waits | None] | None, *, compact: bool = False) -> None:
    if waits is None:
        return
    table.add_column('waits on')
    if compact:
        _time_column(table, 'next deadline (UTC)')
    else:
        table.add_column('next deadline (UTC)')


def _waits_cells(waits: Sequence[Waits | None] | None, index: int) -> list[RenderableType]:
    if waits is None:
        return []
    found = waits[index]
    if found is None:
        return [_dash(None), _dash(None)]
    return [Text(found.calls_text()), Text(found.deadline_text())]


def events_table(
    events: Sequence[StepEvent], *, title: str | None = None, timestamps: bool = True, width: int | None = None
) -> Table:
    """A run's events in order; an answer to a deferred tool call is listed as `call_answered`, with the
    answer (decision, who gave it, and the arguments or message that came with it; when is the event's
    timestamp). Narrower than its
    natural width, the call id goes under the tool, and the answer and error under the kind."""
    with_errors = any(e.error for e in events)
    answers = [answer_of(e) for e in events]
    with_answers = any(a is not None for a in answers)

    def wide() -> Table:
        table = _table(title)
        table.add_column('seq', justify='right')
        table.add_column('step', justify='right')
        table.add_column('kind', no_wrap=True)
        table.add_column('tool', overflow='fold')
        table.add_column('tool_call_id', overflow='fold')
        if with_answers:
            table.add_column('answer', overflow='fold')
        if with_errors:
            table.add_column('error', overflow='fold')
        if timestamps:
            table.add_column('timestamp (UTC)', no_wrap=True)
        for event, answer in zip(events, answers, strict=True):
            row: list[RenderableType] = [
                _dash(event.seq),
                str(event.step_index),
                Text(_kind(event, answer), style=_kind_style(event, answer)),
                _dash(event.tool_name),
                _dash(event.tool_call_id),
            ]
            if with_answers:
                row.append(_dash(None if answer is None else answer_text(answer, when=False)))
            if with_errors:
                row.append(Text(_clip(event.error or '-', 200)))
            if timestamps:
                row.append(_when(event.timestamp))
            table.add_row(*row)
        return table

    def compact() -> Table:
        table = _table(title)
        table.add_column('seq', justify='right', no_wrap=True)
        table.add_column('step', justify='right', no_wrap=True)
        header = 'kind' + (' / answer' if with_answers else '') + (' / error' if with_errors else '')
        add_column(table, Whole(header, overflow='fold'))
        table.add_column('tool / call id', overflow='fold')
        if timestamps:
            _time_column(table, 'timestamp (UTC)')
        for event, answer in zip(events, answers, strict=True):
            kind = Text(_kind(event, answer), style=_kind_style(event, answer))
            if answer is not None:
                kind.append('\n' + _clip(answer_text(answer, when=False), 200))
            if event.error:
                kind.append('\n' + _clip(event.error, 200), style='red')
            named = [v for v in (event.tool_name, event.tool_call_id) if v]
            tool = Text('\n'.join(named)) if named else _dash(None)
            row: list[RenderableType] = [_dash(event.seq), str(event.step_index), kind, tool]
            if timestamps:
                row.append(_when(event.timestamp))
            table.add_row(*row)
        return table

    return _fitted(wide(), compact, width)


def _kind(event: StepEvent, answer: Answer | None) -> str:
    """The kind an event is listed under: an answer to a deferred call is no end of a call of its tool."""
    return ANSWERED if answer is not None else event.kind.value


def _kind_style(event: StepEvent, answer: Answer | None = None) -> str:
    if answer is not None:
        return 'green' if answer.decision in ('approved', 'result') else 'red'
    return 'red' if event.kind.value.endswith('_failed') else ''


def snapshots_table(
    snapshots: Sequence[ContinuableSnapshot],
    *,
    title: str | None = None,
    timestamps: bool = True,
    width: int | None = None,
) -> Table:
    """A run's retained snapshots; narrower than its natural width, its cells wrap."""
    table = _table(title)
    table.add_column('seq', justify='right')
    table.add_column('step', justify='right')
    table.add_column('state', no_wrap=True)
    table.add_column('messages', justify='right')
    table.add_column('last message', overflow='fold')
    if timestamps:
        _time_column(table, 'created_at (UTC)')
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
    return table if width is None else fit(table, width)


def _last_message_summary(messages: Sequence[ModelMessage]) -> str:
    if not messages:
        return '-'
    last = messages[-1]
    kinds = ', '.join(p.part_kind for p in last.parts) or 'no parts'
    return f'{last.kind}: {kinds}'


def effects_table(
    effects: Sequence[ToolEffectRecord],
    *,
    title: str | None = None,
    timestamps: bool = True,
    compact: bool = False,
    width: int | None = None,
) -> Table:
    """A run's tool-effect ledger (`compact`: without step and summary). Narrower than its natural width,
    the call id goes under the tool, and the idempotency key, summary and error share one column."""
    with_errors = any(e.error for e in effects)

    def wide() -> Table:
        table = _table(title)
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
                row.append(Text(_clip(effect.error or '-', 200)))
            if timestamps:
                row.append(_when(effect.updated_at or effect.started_at))
            table.add_row(*row)
        return table

    def narrow() -> Table:
        table = _table(title)
        table.add_column('tool / call id', overflow='fold')
        table.add_column('status', no_wrap=True)
        if not compact:
            table.add_column('step', justify='right', no_wrap=True)
        header = 'idempotency key' if compact else 'key / summary'
        table.add_column(header + (' / error' if with_errors else ''), overflow='fold')
        if timestamps:
            _time_column(table, 'updated_at (UTC)')
        for effect in effects:
            lines = [f'key {effect.idempotency_key}'] if effect.idempotency_key else []
            if not compact and effect.effect_summary:
                lines.append(f'summary {effect.effect_summary}')
            detail = Text('\n'.join(lines))
            if effect.error:
                detail.append(('\n' if lines else '') + f'error {_clip(effect.error, 200)}', style='red')
            if not detail.plain:
                detail = _dash(None)
            row: list[RenderableType] = [
                Text(f'{effect.tool_name}\n{effect.tool_call_id}'),
                Text(effect.status.value, style=_EFFECT_STYLE.get(effect.status, '')),
            ]
            if not compact:
                row.append(str(effect.step_index))
            row.append(detail)
            if timestamps:
                row.append(_when(effect.updated_at or effect.started_at))
            table.add_row(*row)
        return table

    return _fitted(wide(), narrow, width)


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


def job_table(runs: Sequence[JobRun], *, width: int | None = None) -> Table:
    """The runs of a job, oldest first: how each stands and who held it (cells wrap to fit `width`)."""
    table = _table(None)
    table.add_column('run_id', overflow='fold')
    table.add_column('status', no_wrap=True)
    table.add_column('lease', overflow='fold')
    table.add_column('epoch', justify='right', no_wrap=True)
    table.add_column('owner / note', overflow='fold')
    for run in runs:
        lease = run.lease
        if lease is None:
            table.add_row(Text(run.run_id), styled_status(run.status), _dash(None), _dash(None), _dash(None))
            continue
        state = lease.state.value + (f' ({lease.outcome})' if lease.outcome and lease.state is LeaseState.ENDED else '')
        table.add_row(
            Text(run.run_id), styled_status(run.status), Text(state), Text(str(lease.epoch)), _dash(_holder(lease))
        )
    return table if width is None else fit(table, width)


def _holder(lease: Lease) -> str | None:
    """Who holds a lease (`vm pid 7`, `vm pid 7, recovering it`), else what was noted on it."""
    owner = lease.owner
    if owner is None:
        return lease.note
    return owner_text(owner) + (', recovering it' if owner.role == 'recovery' else '')
