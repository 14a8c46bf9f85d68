"""What the library says, told in the command line's words: the commands and flags to type.

The library's errors and reports speak to Python callers (`force=True`, `approve_call`, `resolve_run`).
A person at the command line acts through commands and flags instead, so every error line, outcome
and hint the commands print comes through here: the errors of run ownership are told again from
their fields (the run, its lease, its owner), and what other messages advise in Python is said as
the command or flag that does it. Leases are described from their fields too, without the nested
parentheses of their one-line descriptions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from stepcore.store.leases import (
    DiedAttempt,
    Lease,
    LeaseState,
    Owner,
    RunCancelledError,
    RunClaimedError,
    RunDeadError,
    RunFencedError,
    RunOwnedError,
)
from stepcore.store.waiting import Answer

__all__ = (
    'ANSWERED',
    'DEBUG_HINT',
    'answer_text',
    'cancelled_text',
    'died_text',
    'in_cli_terms',
    'json_text',
    'lease_text',
    'message',
    'owner_text',
    'strip_error_class',
)

DEBUG_HINT = 'set STEPCORE_DEBUG=1 to see the traceback'
"""Said of a failure the command line does not know (an agent's or a tool's own exception)."""

ANSWERED = 'call_answered'
"""The kind `stepcore events` lists an answer to a deferred tool call under (stored as `tool_call_completed`)."""

_SETTLERS = {'supply_result': '--supply', 'mark_checked': '--mark-checked', 'rerun_call': '--rerun'}
_ANSWER_FLAGS = '--approve, --deny, --result JSON or --fail TEXT'

_Rule = tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]

_RULES: tuple[_Rule, ...] = (
    # settling by hand: `recover --supply / --mark-checked / --rerun`
    (re.compile(r'\b(supply_result|mark_checked|rerun_call)(?= refused\b| would act\b)'), lambda m: _SETTLERS[m[1]]),
    (re.compile(r'\b([Pp])ass force=True \(--force\)'), r'\1ass --force'),
    (re.compile(r'force=True \(--force\)'), '--force'),
    (re.compile(r'\bforce=True\b'), '--force'),
    (
        re.compile(
            r'then supply_result\(\.\.\.\), mark_checked\(\.\.\.\) or rerun_call\(\.\.\.\) it \(stepcore recover '
            r'--supply/--mark-checked/--rerun\) and call resolve_run again'
        ),
        'then settle each with `stepcore recover RUN --supply CALL=RESULT`, `--mark-checked CALL` or `--rerun CALL`, '
        'and resume the run again',
    ),
    # answering deferred calls: `stepcore answer`
    (
        re.compile(r'approve_call, deny_call, answer_call or fail_call(?: \(stepcore answer[^)]*\))?'),
        f'`stepcore answer RUN CALL` with {_ANSWER_FLAGS}',
    ),
    (re.compile(r'\buse answer_call or fail_call\b'), 'use --result JSON or --fail TEXT'),
    (re.compile(r'\buse approve_call or deny_call\b'), 'use --approve or --deny'),
    (re.compile(r'\buse fail_call\b'), 'use --fail TEXT'),
    (re.compile(r'\buse deny_call\b'), 'use --deny'),
    # dead runs, jobs, cancelling
    (
        re.compile(r'give it another chance with retry_run \(stepcore recover (\S+) --retry\)'),
        r'give it another chance with `stepcore recover \1 --retry`',
    ),
    (re.compile(r'start_job starts one, `stepcore runs` lists the runs'), 'list the runs with `stepcore runs`'),
    (
        re.compile(r'cancel_run needs a reason \(what a person reading the run later should know\); got (.*)$'),
        r'--reason needs a text: what a person reading the run later should know (got \1)',
    ),
    (
        re.compile(r'cancel_run needs a store with the feature `leases`'),
        '`stepcore cancel` needs a store with the feature leases (`stepcore plugins` lists the features of each '
        'backend)',
    ),
    (re.compile(r'\b[A-Z]\w*Store (keeps no leases|keeps none|does not declare)'), r'this store \1'),
    (re.compile(r'\bclaimed for (resolve_run|recovery)\b'), 'claimed to be resumed'),
    (re.compile(r'\bclaimed for (supply_result|mark_checked|rerun_call)\b'), 'claimed to settle a call'),
    # one parenthesis after another reads as one: `pid 7 (recovering it) (epoch 3, ...)`
    (re.compile(r'\) \('), ', '),
)

_ERROR_CLASS = re.compile(r'^(?:[A-Za-z_]\w*\.)*[A-Z]\w*: ')


def in_cli_terms(text: str) -> str:
    """`text` with the Python it advises (`force=True`, `approve_call`, ...) said as commands and flags."""
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


def strip_error_class(text: str) -> str:
    """`text` without the exception class name it starts with (`RuntimeError: boom` is `boom`)."""
    return _ERROR_CLASS.sub('', text, count=1)


def _moment(moment: datetime) -> str:
    return moment.isoformat(timespec='seconds')


def json_text(value: Any) -> str:
    """`value` as compact JSON on one line (what a person would type back with `--args` or `--result`)."""
    return json.dumps(value, ensure_ascii=False, separators=(', ', ': '), default=str)


def answer_text(answer: Answer, *, when: bool = True) -> str:
    """An answer to a deferred call in one clause: the decision, who gave it and when (`when=False`: not
    when), and what came with it (`approved by alice at 2026-05-01 09:30:00 UTC, to run with {"name":
    "users_old"} instead`)."""
    by = f' by {answer.by}' if answer.by else ''
    at = f' at {answer.at:%Y-%m-%d %H:%M:%S} UTC' if when else ''
    if answer.decision == 'approved':
        instead = f', to run with {json_text(answer.override_args)} instead' if answer.override_args is not None else ''
        return f'approved{by}{at}{instead}'
    if answer.decision == 'result':
        return f'answered{by}{at} with the result {json_text(answer.result)}'
    if answer.decision == 'expired':
        said = f': {answer.message}' if answer.message else ': nobody answered before its deadline, so it was denied'
        return f'expired{at}{said}'
    said = f': {answer.message}' if answer.message else ''
    what = 'denied' if answer.decision == 'denied' else 'failed outside the agent, reported'
    return f'{what}{by}{at}{said}'


def owner_text(owner: Owner | None) -> str:
    """`HOST pid N`, or `an unknown owner`."""
    return 'an unknown owner' if owner is None else f'{owner.host} pid {owner.pid}'


def lease_text(lease: Lease) -> str:
    """A lease in one clause, without nested parentheses: `running on vm pid 7, lease epoch 3 held until
    ...`, `being recovered by vm pid 7, ...`, `resumed by run r2`, `ended: completed`, `pending: ...`."""
    if lease.state is LeaseState.RUNNING and lease.owner is not None:
        hold = 'expired at' if lease.expired else 'held until'
        doing = 'being recovered by' if lease.owner.role == 'recovery' else 'running on'
        return f'{doing} {owner_text(lease.owner)}, lease epoch {lease.epoch} {hold} {_moment(lease.expires_at)}'
    if lease.state is LeaseState.RUNNING:
        return f'running, lease epoch {lease.epoch}, with no owner'
    if lease.state is LeaseState.RESUMED:
        return f'resumed by run {lease.resumed_by}'
    if lease.state is LeaseState.DEAD:
        return f'dead: {len(lease.died)} resumptions died'
    said = lease.note or lease.outcome
    return f'{lease.state.value}: {said}' if said else lease.state.value


def died_text(attempt: DiedAttempt) -> str:
    """A resumption that died, in one clause: `r2 on vm pid 7, epoch 2, owner gone`."""
    return f'{attempt.run_id} on {attempt.owner}, epoch {attempt.epoch}, {attempt.why}'


def _owned(lease: Lease, action: str | None, force: str | None) -> str:
    owner = lease.owner
    doing = 'being recovered by' if owner is not None and owner.role == 'recovery' else 'running on'
    left = max(lease.seconds_left, 0)
    text = (
        f'run {lease.run_id!r} is {doing} {owner_text(owner)}, lease epoch {lease.epoch} held until '
        f'{_moment(lease.expires_at)}, {left:.0f} s from now: {action or "this command"} would act on a live '
        'run. Wait until the run ends or its lease expires'
    )
    if force:
        text += f', or, if you know that process is gone, run the command again with {force}'
    return text


def _claimed(run_id: str, lease: Lease | None) -> str:
    see = f'see how it stands with `stepcore recover {run_id}`'
    if lease is None:
        return f'run {run_id!r} was taken meanwhile: its lease is gone; {see}'
    if lease.state is LeaseState.RESUMED:
        return (
            f'run {run_id!r} was resumed by run {lease.resumed_by!r} meanwhile, and a run is resumed once: see how '
            f'that run stands with `stepcore recover {lease.resumed_by}`'
        )
    owner = lease.owner
    if owner is not None:
        doing = 'to recover it' if owner.role == 'recovery' else 'to run it'
        since = f' since {_moment(lease.since)}' if lease.since is not None else ''
        return (
            f'run {run_id!r} was claimed first by {owner_text(owner)} {doing}, lease epoch {lease.epoch}{since}: '
            f'another process acts on it now; {see}'
        )
    return f'run {run_id!r} is {lease_text(lease)} meanwhile; {see}'


def cancelled_text(lease: Lease) -> str:
    """Why nothing acts on a cancelled run any more."""
    how = lease.note or 'cancelled'
    return f'run {lease.run_id!r} was {how}. A cancelled run is never resumed, settled or answered'


def _fenced(error: RunFencedError) -> str:
    lease = error.lease
    if lease is None:
        now = 'the run no longer has a lease: it was deleted'
    elif lease.cancelled:
        now = f'it was {lease.note or "cancelled"}'
    elif lease.owner is not None and lease.epoch != error.epoch:
        now = f'{owner_text(lease.owner)} took it over at lease epoch {lease.epoch}'
    else:
        now = f'it is now {lease_text(lease)}'
    return (
        f'run {error.run_id!r} was taken from this command while it wrote to it at lease epoch {error.epoch}: '
        f'{now}. Nothing of that write was stored; see how the run stands with `stepcore recover {error.run_id}`'
    )


def _dead(lease: Lease) -> str:
    attempts = '; '.join(died_text(a) for a in lease.died)
    return (
        f'run {lease.run_id!r} is dead: {len(lease.died)} resumptions of it died ({attempts}). Recovery does not '
        'resume it any more: find what kills its worker, then give it another chance with '
        f'`stepcore recover {lease.run_id} --retry`'
    )


def message(exc: BaseException, *, action: str | None = None, force: str | None = None) -> str:
    """What `exc` means, in the command line's words (see `stepcore.cli.console.explain`)."""
    from stepcore.cli.stores import StoreError
    from stepcore.recovery.jobs import JobExistsError
    from stepcore.recovery.resolution import RunAbandonedError

    if isinstance(exc, RunOwnedError):
        return _owned(exc.lease, action, force)
    if isinstance(exc, RunCancelledError):
        return cancelled_text(exc.lease)
    if isinstance(exc, RunClaimedError):
        return _claimed(exc.run_id, exc.lease)
    if isinstance(exc, RunFencedError):
        return _fenced(exc)
    if isinstance(exc, RunDeadError):
        return _dead(exc.lease)
    if isinstance(exc, RunAbandonedError):
        return (
            f'run {exc.run_id!r} is an abandoned resumption of run {exc.resumes!r}: it was stopped before it took '
            f'{exc.resumes!r} over, and ran nothing of it. Recover {exc.resumes!r} instead: '
            f'`stepcore recover {exc.resumes}`'
        )
    if isinstance(exc, JobExistsError):
        newest = f' (its newest run is {exc.run_id!r})' if exc.run_id != exc.job_id else ''
        return (
            f'job {exc.job_id!r} was started already and is {exc.status}{newest}: a job is not started twice; '
            f'see it with `stepcore job {exc.job_id}`'
        )
    if isinstance(exc, StoreError | LookupError | ValueError):
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        return in_cli_terms(text) or 'the command failed'
    if isinstance(exc, OSError):
        where = f' {exc.filename!r}' if exc.filename else ''
        return f'{exc.strerror or strip_error_class(str(exc)) or "the system refused"}{where}'
    text = in_cli_terms(strip_error_class(str(exc)))
    return f'{text} ({DEBUG_HINT})' if text else f'the command failed for a reason it cannot tell: {DEBUG_HINT}'
