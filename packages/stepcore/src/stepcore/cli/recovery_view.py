"""`inspect_recovery`'s report, told in words."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import typer
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from stepcore.cli.lease_json import lease_json
from stepcore.cli.words import answer_text, died_text, lease_text, owner_text
from stepcore.recovery.inspection import RecoveryReport
from stepcore.recovery.paused import Waiting
from stepcore.recovery.standing import offers_resume
from stepcore.store.codec import dump_record
from stepcore.store.leases import Lease, LeaseState
from stepcore.store.models import ContinuableSnapshot, RunRecord, ToolEffectRecord, utcnow
from stepcore.store.step_store import StepStore
from stepcore.store.waiting import DeferredCall

__all__ = (
    'describe_answers',
    'describe_call',
    'describe_recovery',
    'parse_supplied',
    'recovery_json',
    'resumed_pause',
)


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
    """One line for a deferred call: what it waits for, its arguments and deadline, its answer (who gave
    it, when, and the arguments it runs with or the message the model is told)."""
    if waiting.resumed_by is not None:  # the pause is over: say what the call asked for
        need = 'asked for approval' if call.kind == 'approval' else f'asked for its result from outside ({call.kind})'
    else:
        need = 'needs approval' if call.kind == 'approval' else f'needs its result from outside ({call.kind})'
    text = f'- {call.tool_name} ({call.tool_call_id}) {need}, args {_args(call.args)}'
    answer = waiting.answers.get(call.tool_call_id)
    if answer is not None:
        return f'{text}: {answer_text(answer)}'
    if call.deadline is not None:
        when = f'{call.deadline:%Y-%m-%d %H:%M:%S} UTC'
        return f'{text}: expired at {when}, denied on resume' if call.expired(now) else f'{text}: answer by {when}'
    return f'{text}: waiting for an answer'


def describe_answers(waiting: Waiting, *, resumed_here: bool = False) -> list[RenderableType]:
    """A pause and its calls with their answers, as lines: waiting for answers, resumed with them, or (with
    `resumed_here`, for the run that resumed it) the answers that run carried on with."""
    now = utcnow()
    at = f'{waiting.paused_at:%Y-%m-%d %H:%M:%S} UTC'
    if resumed_here:
        head = (
            f'It resumes run {waiting.run_id}, which paused on deferred tool calls at {at}; it carried on with '
            'these answers:'
        )
    elif waiting.resumed_by is not None:
        head = f'Paused on deferred tool calls at {at}; run {waiting.resumed_by} resumed it with these answers:'
    else:
        head = f'Paused on deferred tool calls since {at}: the run waits for answers, not for recovery.'
    lines: list[RenderableType] = [Text(head, style='bold')]
    for call in waiting.calls:
        lines.append(Padding(Text(describe_call(waiting, call, now)), (0, 0, 0, 2), expand=False))
    return lines


def _describe_waiting(run_id: str, waiting: Waiting) -> RenderableType:
    lines = describe_answers(waiting)
    if waiting.ready(utcnow()):
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


def _effect_line(effect: ToolEffectRecord, style: str) -> RenderableType:
    detail = f'- {effect.tool_name} ({effect.tool_call_id}) {effect.status.value}, args {_args(effect.args)}'
    if effect.effect_summary:
        detail += f': {effect.effect_summary}'
    if effect.idempotency_key:
        detail += f' [idempotency key {effect.idempotency_key}]'
    return Padding(Text(detail, style=style), (0, 0, 0, 2), expand=False)


def describe_recovery(
    run_id: str,
    report: RecoveryReport,
    *,
    owners: bool = True,
    status: str | None = None,
    resumes: Waiting | None = None,
) -> RenderableType:
    """A few sentences: what is saved, what may have happened, and what to do next.

    `status` is the run's status from its events (`None`: told from its lease only); `resumes` the
    pause of the run this one resumes, whose answers it carried on with. `owners=False` leaves out
    who holds a lease and until when (a process id, a time), for a text that reads the same every
    time (the demo's).
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
        if report.waiting is not None:
            lines.extend(describe_answers(report.waiting))
        if report.newest_status == 'completed':
            say('Nothing left to do: its newest continuation completed.', 'green')
        else:
            say(f'Next: `stepcore recover {newest_run}` tells how that run stands.', 'bold')
        return Group(*lines)
    if report.waiting is not None:
        return _describe_waiting(run_id, report.waiting)
    if report.live:
        return _describe_live(run_id, report, resumes)
    finished = status == 'completed' or (
        lease is not None and lease.state is LeaseState.ENDED and lease.outcome == 'completed'
    )
    resumable = offers_resume(status, lease, resumed=False)
    if lease is not None and lease.state is LeaseState.RUNNING:
        held = f' ({_orphan_lease_text(lease)})' if owners else ''
        say(
            f'Orphaned: its lease{held} has no live owner. Any worker may claim and resume it: '
            f'`stepcore resume {run_id} --agent MODULE:ATTR`, or a recovery worker '
            '(`stepcore recover --orphans --agent MODULE:ATTR`).',
            'yellow',
        )
    elif lease is not None and lease.state is LeaseState.PENDING and lease.note:
        say(f'Pending a person: {lease.note}.', 'yellow')
    elif lease is not None and lease.state is LeaseState.DEAD:
        died = '; '.join(died_text(attempt) for attempt in lease.died)
        say(
            f'Dead: {len(lease.died)} resumptions of it died ({died}). Recovery does not resume it any more: find '
            f'what kills its worker, then give it another chance with `stepcore recover {run_id} --retry`.',
            'bold red',
        )
    elif lease is not None and lease.cancelled:
        say(f'Cancelled: it was {lease.note or "cancelled"}. A cancelled run is never resumed.', 'bold red')
    elif finished:
        say(f'Completed: run {run_id} has nothing left to do.', 'green')
    elif not report.leases_kept and resumable:
        say(
            'This store keeps no leases, so ownership cannot be checked: make sure no process still runs the run '
            'before you settle or resume it.',
            'yellow',
        )
    if resumes is not None:
        lines.extend(describe_answers(resumes, resumed_here=True))
    if settled is not None:
        say(
            f'Settled snapshot: seq {settled.seq} at step {settled.step_index}, {len(settled.messages)} messages; '
            'every tool call in it has its result.',
            'green',
        )
    elif report.start_point and resumable:
        say(
            "No settled snapshot, but the store kept the run's start point (the history and prompt it began "
            'with): `stepcore resume` resumes it from its first request.',
            'yellow',
        )
    elif resumable:
        say('No settled snapshot: there is nothing to resume from.', 'yellow')
    else:
        say('No settled snapshot.')
    if newest is not None and report.interrupted:
        say(
            f'Newest snapshot: seq {newest.seq} at step {newest.step_index} is interrupted: it holds tool calls '
            'without results. A resumption starts from the settled snapshot and settles those calls first.',
            'yellow',
        )
    _tools(report, say)
    if report.unresolved:
        say('Unresolved tool calls: started, never finished. Each may or may not have had its effect:', 'bold yellow')
        lines.extend(_effect_line(effect, 'yellow') for effect in report.unresolved)
        if resumable:
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
    if not resumable:
        pass  # nothing to resume: it completed, ended otherwise, is dead (see --retry above) or has no lease to tell
    elif settled is not None or report.start_point:
        if report.continuable_as_is:
            verb = 'continue from the settled point'
        elif report.unresolved or report.settled_on_recovery:
            verb = 'settle the calls and resume'
        else:
            verb = 'resume it from its start point' if settled is None else 'resume it'
        say(f'Next: `stepcore resume {run_id} --agent MODULE:ATTR` to {verb}.', 'bold')
    else:
        say(
            'It cannot be resumed: it stopped before its first settled step and saved nothing to resume from. '
            'Start it again.',
            'bold',
        )
    return Group(*lines)


def _orphan_lease_text(lease: Lease) -> str:
    """The lease of an orphan in one clause: who held it and until when (not `running on`: nothing runs it)."""
    if lease.owner is None:
        return lease_text(lease)
    until = 'expired at' if lease.expired else 'until'
    return (
        f'taken by {owner_text(lease.owner)}, lease epoch {lease.epoch}, {until} '
        f'{lease.expires_at.isoformat(timespec="seconds")}'
    )


def _tools(report: RecoveryReport, say: Callable[[str, str], None]) -> None:
    if report.completed_tools:
        say(f'Tools with completed calls: {", ".join(report.completed_tools)}.', '')
    if report.failed_tools:
        say(f'Tools with failed calls (may have made partial changes): {", ".join(report.failed_tools)}.', 'red')


def _describe_live(run_id: str, report: RecoveryReport, resumes: Waiting | None) -> RenderableType:
    """A run a live owner holds: what it saved so far, and its calls in flight, running rather than cut
    short. Nothing to recover, settle or resume while it runs."""
    lines: list[RenderableType] = []

    def say(text: str, style: str = '') -> None:
        lines.append(Text(text, style=style))

    lease = report.lease
    assert lease is not None
    owner = lease.owner
    doing = 'Being recovered now by' if owner is not None and owner.role == 'recovery' else 'Running now on'
    say(
        f'{doing} {owner_text(owner)}, its lease held until {lease.expires_at.isoformat(timespec="seconds")} '
        f'(epoch {lease.epoch}): recovery refuses a live run, and nothing of it needs recovering while it runs.',
        'bold',
    )
    if resumes is not None:
        lines.extend(describe_answers(resumes, resumed_here=True))
    settled = report.settled
    if settled is not None:
        say(
            f'Settled snapshot: seq {settled.seq} at step {settled.step_index}, {len(settled.messages)} messages; '
            'every tool call in it has its result.',
            'green',
        )
    else:
        say('No settled snapshot yet: its first step is under way.')
    _tools(report, say)
    if report.unresolved:
        count = len(report.unresolved)
        say(f'Tool call{"s" if count != 1 else ""} running now (started, no result yet):', 'bold')
        lines.extend(_effect_line(effect, '') for effect in report.unresolved)
    say(f'Next: nothing while it runs; `stepcore recover {run_id}` tells how it stands once it ends.')
    return Group(*lines)


async def resumed_pause(store: StepStore, record: RunRecord | None) -> Waiting | None:
    """The pause of the run `record`'s run resumes, with its answers; `None` when it resumes none, or one
    that did not pause on deferred tool calls."""
    from stepcore.capability.context import RESUMES_KEY
    from stepcore.recovery.answers import read_waiting

    origin = record.metadata.get(RESUMES_KEY) if record is not None else None
    return await read_waiting(store, run_id=origin) if isinstance(origin, str) else None


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
