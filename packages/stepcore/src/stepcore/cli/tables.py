"""The tables of stored records: runs, events, snapshots and the tool-effect ledger, each laid out
narrower (cells under each other, then wrapped) when the terminal is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic_ai.messages import ModelMessage
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from stepcore.cli.cells import clip, dash, styled_status, titled_table, when
from stepcore.cli.fitting import Whole, add_column, cell_lines, fit, fitted, time_column
from stepcore.cli.words import ANSWERED, answer_text, died_text, owner_text
from stepcore.ownership.identity import owner_gone
from stepcore.recovery.standing import Standing
from stepcore.store.lifecycle import run_status as lifecycle_status
from stepcore.store.models import ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus
from stepcore.store.waiting import Answer, answer_of

__all__ = ('Waits', 'effects_table', 'events_table', 'run_status', 'runs_table', 'snapshots_table', 'standing_label')

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
        return '-' if self.deadline is None else when(self.deadline)


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
        table = titled_table(title)
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
                dash(run.agent_name),
                styled_status(status),
                dash(run.conversation_id),
                dash(run.parent_run_id),
            ]
            if timestamps:
                row.append(when(run.started_at))
            row.extend(_waits_cells(waits, index))
            table.add_row(*row)
        return table

    def compact() -> Table:
        table = titled_table(title)
        table.add_column('run_id', overflow='fold')
        add_column(table, Whole('agent', overflow='fold'))
        table.add_column('status', overflow='fold')
        if timestamps:
            time_column(table, 'started_at (UTC)')
        _waits_columns(table, waits, compact=True)
        for index, (run, status) in enumerate(zip(runs, statuses, strict=True)):
            row: list[RenderableType] = [
                cell_lines(run.run_id, ('conversation', run.conversation_id), ('parent', run.parent_run_id)),
                dash(run.agent_name),
                styled_status(status),
            ]
            if timestamps:
                row.append(when(run.started_at))
            row.extend(_waits_cells(waits, index))
            table.add_row(*row)
        return table

    return fitted(wide(), compact, width)


def _waits_columns(table: Table, waits: Sequence[Waits | None] | None, *, compact: bool = False) -> None:
    if waits is None:
        return
    table.add_column('waits on')
    if compact:
        time_column(table, 'next deadline (UTC)')
    else:
        table.add_column('next deadline (UTC)')


def _waits_cells(waits: Sequence[Waits | None] | None, index: int) -> list[RenderableType]:
    if waits is None:
        return []
    found = waits[index]
    if found is None:
        return [dash(None), dash(None)]
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
        table = titled_table(title)
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
                dash(event.seq),
                str(event.step_index),
                Text(_kind(event, answer), style=_kind_style(event, answer)),
                dash(event.tool_name),
                dash(event.tool_call_id),
            ]
            if with_answers:
                row.append(dash(None if answer is None else answer_text(answer, when=False)))
            if with_errors:
                row.append(Text(clip(event.error or '-', 200)))
            if timestamps:
                row.append(when(event.timestamp))
            table.add_row(*row)
        return table

    def compact() -> Table:
        table = titled_table(title)
        table.add_column('seq', justify='right', no_wrap=True)
        table.add_column('step', justify='right', no_wrap=True)
        header = 'kind' + (' / answer' if with_answers else '') + (' / error' if with_errors else '')
        add_column(table, Whole(header, overflow='fold'))
        table.add_column('tool / call id', overflow='fold')
        if timestamps:
            time_column(table, 'timestamp (UTC)')
        for event, answer in zip(events, answers, strict=True):
            kind = Text(_kind(event, answer), style=_kind_style(event, answer))
            if answer is not None:
                kind.append('\n' + clip(answer_text(answer, when=False), 200))
            if event.error:
                kind.append('\n' + clip(event.error, 200), style='red')
            named = [v for v in (event.tool_name, event.tool_call_id) if v]
            tool = Text('\n'.join(named)) if named else dash(None)
            row: list[RenderableType] = [dash(event.seq), str(event.step_index), kind, tool]
            if timestamps:
                row.append(when(event.timestamp))
            table.add_row(*row)
        return table

    return fitted(wide(), compact, width)


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
    table = titled_table(title)
    table.add_column('seq', justify='right')
    table.add_column('step', justify='right')
    table.add_column('state', no_wrap=True)
    table.add_column('messages', justify='right')
    table.add_column('last message', overflow='fold')
    if timestamps:
        time_column(table, 'created_at (UTC)')
    for snap in snapshots:
        state_style = 'green' if snap.state.value == 'complete' else 'yellow'
        row: list[RenderableType] = [
            dash(snap.seq),
            str(snap.step_index),
            Text(snap.state.value, style=state_style),
            str(len(snap.messages)),
            Text(_last_message_summary(snap.messages)),
        ]
        if timestamps:
            row.append(when(snap.timestamp))
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
        table = titled_table(title)
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
            row.append(dash(effect.idempotency_key))
            if not compact:
                row.append(dash(effect.effect_summary))
            if with_errors:
                row.append(Text(clip(effect.error or '-', 200)))
            if timestamps:
                row.append(when(effect.updated_at or effect.started_at))
            table.add_row(*row)
        return table

    def narrow() -> Table:
        table = titled_table(title)
        table.add_column('tool / call id', overflow='fold')
        table.add_column('status', no_wrap=True)
        if not compact:
            table.add_column('step', justify='right', no_wrap=True)
        header = 'idempotency key' if compact else 'key / summary'
        table.add_column(header + (' / error' if with_errors else ''), overflow='fold')
        if timestamps:
            time_column(table, 'updated_at (UTC)')
        for effect in effects:
            lines = [f'key {effect.idempotency_key}'] if effect.idempotency_key else []
            if not compact and effect.effect_summary:
                lines.append(f'summary {effect.effect_summary}')
            detail = Text('\n'.join(lines))
            if effect.error:
                detail.append(('\n' if lines else '') + f'error {clip(effect.error, 200)}', style='red')
            if not detail.plain:
                detail = dash(None)
            row: list[RenderableType] = [
                Text(f'{effect.tool_name}\n{effect.tool_call_id}'),
                Text(effect.status.value, style=_EFFECT_STYLE.get(effect.status, '')),
            ]
            if not compact:
                row.append(str(effect.step_index))
            row.append(detail)
            if timestamps:
                row.append(when(effect.updated_at or effect.started_at))
            table.add_row(*row)
        return table

    return fitted(wide(), narrow, width)
