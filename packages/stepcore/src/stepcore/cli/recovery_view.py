"""`inspect_recovery`'s report, told in words."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from ..codec import dump_record
from ..models import ContinuableSnapshot
from ..recovery import RecoveryReport

__all__ = ('describe_recovery', 'recovery_json')


def _snap(snapshot: ContinuableSnapshot | None) -> dict[str, Any] | None:
    if snapshot is None:
        return None
    return {
        'seq': snapshot.seq,
        'step_index': snapshot.step_index,
        'state': snapshot.state.value,
        'message_count': len(snapshot.messages),
    }


def recovery_json(report: RecoveryReport) -> dict[str, Any]:
    return {
        'run_id': report.run_id,
        'newest_snapshot': _snap(report.latest),
        'settled_snapshot': _snap(report.settled),
        'interrupted': report.interrupted,
        'unresolved_effects': [dump_record(e) for e in report.unresolved],
        'completed_tools': list(report.completed_tools),
        'failed_tools': list(report.failed_tools),
    }


def describe_recovery(run_id: str, report: RecoveryReport) -> RenderableType:
    """A few sentences: what is saved, what may have happened, and what to do next."""
    lines: list[RenderableType] = []

    def say(text: str, style: str = '') -> None:
        lines.append(Text(text, style=style))

    settled = report.settled
    newest = report.latest
    if settled is not None:
        say(
            f'Settled snapshot: seq {settled.seq} at step {settled.step_index}, {len(settled.messages)} messages; '
            'every tool call in it has its result.',
            'green',
        )
    else:
        say('No settled snapshot: continue_run has nothing to resume from by default.', 'yellow')
    if newest is not None and report.interrupted:
        say(
            f'Newest snapshot: seq {newest.seq} at step {newest.step_index} is interrupted: it holds tool calls '
            'without results. It is only used with include_interrupted=True.',
            'yellow',
        )
    if report.completed_tools:
        say(f'Tools with completed calls: {", ".join(report.completed_tools)}.')
    if report.failed_tools:
        say(f'Tools with failed calls (may have made partial changes): {", ".join(report.failed_tools)}.', 'red')
    if report.unresolved:
        say('Unresolved tool calls: started, never finished. Each may or may not have had its effect:', 'bold yellow')
        for effect in report.unresolved:
            detail = f'- {effect.tool_name} ({effect.tool_call_id})'
            if effect.effect_summary:
                detail += f': {effect.effect_summary}'
            if effect.idempotency_key:
                detail += f' [idempotency key {effect.idempotency_key}]'
            lines.append(Padding(Text(detail, style='yellow'), (0, 0, 0, 2), expand=False))
        say(
            'Check those effects outside the agent (or let the tools deduplicate by their idempotency key) '
            'before running them again.'
        )
    else:
        say('No unresolved tool calls: the ledger shows nothing that may have half happened.')
    if settled is not None:
        say(
            f'Next: history = await continue_run(store, run_id={run_id!r}), then '
            'agent.run(message_history=history) to carry on from the settled point.',
            'bold',
        )
    elif newest is not None:
        say(
            f'Next: after checking the unresolved calls, continue_run(store, run_id={run_id!r}, '
            'include_interrupted=True) resumes from the interrupted snapshot.',
            'bold',
        )
    return Group(*lines)
