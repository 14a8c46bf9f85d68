"""`inspect_recovery`'s report, told in words."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import typer
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from stepcore.cli.render import lease_json
from stepcore.cli.words import died_text, lease_text, owner_text
from stepcore.recovery.inspection import RecoveryReport
from stepcore.recovery.paused import Waiting
from stepcore.store.codec import dump_record
from stepcore.store.models import ContinuableSnapshot, utcnow
from stepcore.store.waiting import DeferredCall

__all__ = ('describe_call', 'describe_recovery', 'parse_supplied', 'recovery_json')


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
        'continuable_as_is': report.continuable_as_is,
        'settled_on_recovery': list(report.settled_on_recovery),
        'unresolved_effects': [dump_record(e) for e in report.unresolved],
        'completed_tools': list(report.completed_tools),
        'failed_tools': list(report.failed_tools),
        'leases_kept': report.leases_kept,
        'lease': _lease(report),
        'resumed_by': list(report.resumed_by),
        'newest_status': report.newest_status,
        'start_point': report.start_point,
        'waiting': _waiting(report.waiting),
    }


def _waiting(waiting: Waiting | None) -> dict[str, Any] | None:
    if waiting is None:
        return None
    return {
        'paused_at': waiting.paused_at.isoformat(),
        'resumed_by': waiting.resumed_by,
        'ready': waiting.ready(),
        'calls': [
            {
                **call.to_json(),
                'answer': answer.to_json() if (answer := waiting.answers.get(call.tool_call_id)) is not None else None,
            }
            for call in waiting.calls
        ],
    }


def describe_call(waiting: Waiting, call: DeferredCall, now: datetime) -> str:
    """One line for a deferred call: what it waits for, its arguments and deadline, its answer."""
    need = 'needs approval' if call.kind == 'approval' else f'needs its result from outside ({call.kind})'
    text = f'- {call.tool_name} ({call.tool_call_id}) {need}, args {_args(call.args)}'
    answer = waiting.answers.get(call.tool_call_id)
    if answer is not None:
        return f'{text}: {answer.describe()}'
    if call.deadline is not None:
        when = f'{call.deadline:%Y-%m-%d %H:%M:%S} UTC'
        return f'{text}: expired at {when}, denied on resume' if call.expired(now) else f'{text}: answer by {when}'
    return f'{text}: waiting for an answer'


def _describe_waiting(run_id: str, waiting: Waiting) -> RenderableType:
    now = utcnow()
    lines: list[RenderableType] = [
        Text(
            f'Paused on deferred tool calls since {waiting.paused_at:%Y-%m-%d %H:%M:%S} UTC: the run waits for '
            'answers, not for recovery.',
            style='bold',
        )
    ]
    for call in waiting.calls:
        lines.append(Padding(Text(describe_call(waiting, call, now)), (0, 0, 0, 2), expand=False))
    if waiting.ready(now):
        next_step = (
            f'Next: every call is answered. Resume it once, from any process: `stepcore resume {run_id} --agent '
            'MODULE:ATTR`.'
        )
    else:
        next_step = (
            f'Next: answer each call with `stepcore answer {run_id} CALL --approve [--args JSON]`, `--deny '
            f'[--message TEXT]`, `--result JSON` or `--fail TEXT`, then resume it with `stepcore resume {run_id} '
            '--agent MODULE:ATTR`.'
        )
    lines.append(Text(next_step, style='bold'))
    return Group(*lines)


def _lease(report: RecoveryReport) -> dict[str, Any] | None:
    lease = report.lease
    if lease is None:
        return None
    return {**lease_json(lease), 'live': report.live}


def describe_recovery(run_id: str, report: RecoveryReport, *, owners: bool = True) -> RenderableType:
    """A few sentences: what is saved, what may have happened, and what to do next.

    `owners=False` leaves out who holds a lease and until when (a process id, a time), for a text
    that reads the same every time (the demo's).
    """
    lines: list[RenderableType] = []

    def say(text: str, style: str = '') -> None:
        lines.append(Text(text, style=style))

    settled = report.settled
    newest = report.latest
    lease = report.lease
    if report.resumed_by:
        newest_run = report.resumed_by[-1]
        say(
            f'Resumed by {newest_run} ({report.newest_status or "unknown"}): a resumed run is never resumed again. '
            f'Recovery acts on its newest continuation, {newest_run}.',
            'bold',
        )
        if report.newest_status == 'completed':
            say('Nothing left to do: its newest continuation completed.', 'green')
        else:
            say(f'Next: `stepcore recover {newest_run}` tells how that run stands.', 'bold')
        return Group(*lines)
    if report.waiting is not None:
        return _describe_waiting(run_id, report.waiting)
    if report.live and lease is not None and lease.owner is not None:
        doing = 'Being recovered now by' if lease.owner.role == 'recovery' else 'Running now on'
        say(
            f'{doing} {owner_text(lease.owner)}, its lease held until '
            f'{lease.expires_at.isoformat(timespec="seconds")} (epoch {lease.epoch}): recovery refuses a live run. '
            'Wait until it ends or its lease expires; if you know that process is gone, pass --force to '
            f'`stepcore recover {run_id} --supply ...` or `stepcore resume {run_id}`.',
            'bold yellow',
        )
    elif lease is not None and lease.state.value == 'running':
        held = f' ({lease_text(lease)})' if owners else ''
        say(
            f'Orphaned: its lease{held} has no live owner. Any worker may claim and resume it: '
            f'`stepcore resume {run_id} --agent MODULE:ATTR`, or a recovery worker '
            '(`stepcore recover --orphans --agent MODULE:ATTR`).',
            'yellow',
        )
    elif lease is not None and lease.state.value == 'pending' and lease.note:
        say(f'Pending a person: {lease.note}.', 'yellow')
    elif lease is not None and lease.state.value == 'dead':
        died = '; '.join(died_text(attempt) for attempt in lease.died)
        say(
            f'Dead: {len(lease.died)} resumptions of it died ({died}). Recovery does not resume it any more: find '
            f'what kills its worker, then give it another chance with `stepcore recover {run_id} --retry`.',
            'bold red',
        )
    elif lease is not None and lease.cancelled:
        say(f'Cancelled: it was {lease.note or "cancelled"}. A cancelled run is never resumed.', 'bold red')
    elif lease is not None and lease.state.value == 'ended' and lease.outcome == 'completed':
        say(f'Completed: run {run_id} has nothing left to do.', 'green')
    elif not report.leases_kept:
        say(
            'This store keeps no leases, so ownership cannot be checked: make sure no process still runs the run '
            'before you settle or resume it.',
            'yellow',
        )
    if settled is not None:
        say(
            f'Settled snapshot: seq {settled.seq} at step {settled.step_index}, {len(settled.messages)} messages; '
            'every tool call in it has its result.',
            'green',
        )
    elif report.start_point:
        say(
            "No settled snapshot, but the store kept the run's start point (the history and prompt it began "
            'with): `stepcore resume` resumes it from its first request.',
            'yellow',
        )
    else:
        say('No settled snapshot: there is nothing to resume from.', 'yellow')
    if newest is not None and report.interrupted:
        say(
            f'Newest snapshot: seq {newest.seq} at step {newest.step_index} is interrupted: it holds tool calls '
            'without results. A resumption starts from the settled snapshot and settles those calls first.',
            'yellow',
        )
    if report.completed_tools:
        say(f'Tools with completed calls: {", ".join(report.completed_tools)}.')
    if report.failed_tools:
        say(f'Tools with failed calls (may have made partial changes): {", ".join(report.failed_tools)}.', 'red')
    if report.unresolved:
        say('Unresolved tool calls: started, never finished. Each may or may not have had its effect:', 'bold yellow')
        for effect in report.unresolved:
            detail = f'- {effect.tool_name} ({effect.tool_call_id}) {effect.status.value}, args {_args(effect.args)}'
            if effect.effect_summary:
                detail += f': {effect.effect_summary}'
            if effect.idempotency_key:
                detail += f' [idempotency key {effect.idempotency_key}]'
            lines.append(Padding(Text(detail, style='yellow'), (0, 0, 0, 2), expand=False))
        say(
            'The run cannot be continued as is: continuing from the settled snapshot would let the model '
            'call these tools again. Tools with a recovery policy are settled when the run is resumed; check the '
            'others outside the agent, then settle each with '
            f'`stepcore recover {run_id} --supply CALL=RESULT`, `--mark-checked CALL` (it happened) or '
            '`--rerun CALL` (it did not).',
            'yellow',
        )
    else:
        say('No unresolved tool calls: the ledger shows nothing that may have half happened.')
    if report.settled_on_recovery:
        say(
            f'Settled on recovery, with results in no snapshot of this run: {", ".join(report.settled_on_recovery)}. '
            '`stepcore resume` hands their results over again; continuing from the snapshot alone would let the '
            'model call them again.',
            'yellow',
        )
    if lease is not None and (lease.cancelled or (lease.state.value == 'ended' and lease.outcome == 'completed')):
        pass  # nothing to resume
    elif settled is not None or report.start_point:
        if report.continuable_as_is:
            verb = 'continue from the settled point'
        elif report.unresolved or report.settled_on_recovery:
            verb = 'settle the calls and resume'
        else:
            verb = 'resume it from its start point' if settled is None else 'resume it'
        if report.live:
            verb += ' once its owner is gone'
        say(f'Next: `stepcore resume {run_id} --agent MODULE:ATTR` to {verb}.', 'bold')
    else:
        say(
            'It cannot be resumed: it stopped before its first settled step and saved nothing to resume from. '
            'Start it again.',
            'bold',
        )
    return Group(*lines)


def _args(args: Any) -> str:
    """The call's arguments as compact JSON (cut short past 200 characters)."""
    text = json.dumps(args, ensure_ascii=False, separators=(', ', ': '), default=str)
    return text if len(text) <= 200 else text[:199] + '…'


def parse_supplied(item: str) -> tuple[str, Any]:
    """`CALL=RESULT` as (call id, result): the result as JSON when it parses, else the text itself."""
    call_id, sep, raw = item.partition('=')
    if not sep or not call_id:
        raise typer.BadParameter(f'{item!r} is not CALL=RESULT: write the tool call id, "=", then the result')
    return call_id, parse_json_or_text(raw)


def parse_json_or_text(raw: str) -> Any:
    """`raw` as JSON when it parses, else the text itself."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw
