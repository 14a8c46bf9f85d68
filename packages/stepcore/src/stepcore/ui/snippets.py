"""Copyable Python for resuming or branching a run, as the recovery report suggests."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from stepcore.recovery.inspection import RecoveryReport
from stepcore.recovery.paused import Waiting
from stepcore.recovery.standing import offers_resume
from stepcore.ui.recovery_panel import RecoveryView

__all__ = ('Snippet', 'display_url', 'recovery_snippets')


@dataclass(frozen=True, kw_only=True)
class Snippet:
    title: str
    code: str


def display_url(url: str) -> str:
    """The store URL with any password replaced by `<password>`, safe to show and to copy."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    netloc = parts.netloc.rsplit('@', 1)
    user = netloc[0].split(':', 1)[0]
    return urlunsplit(parts._replace(netloc=f'{user}:<password>@{netloc[1]}'))


def _open_line(store_url: str, media_hint: str | None) -> str:
    line = f'async with open_store({display_url(store_url)!r}'
    if media_hint:
        line += f', media_store={media_hint}'
    return line + ') as store:'


def recovery_snippets(
    report: RecoveryReport | RecoveryView, *, store_url: str, media_hint: str | None = None
) -> list[Snippet]:
    """The code that fits how the run stands, or nothing without a snapshot to start from.

    A paused run that nobody resumed yet gets the answers it waits for and one `resume_run`. A run a
    crash cut short (or a failure ended) gets a `resolve_run` resumption, which settles its unresolved
    calls by their tools' recovery policies before it goes on, and a `fork_run` call. Any other run (a
    live one, one resumed already, one that completed or ended otherwise) gets the fork only: there is
    nothing to resume. Without a settled snapshot the fork passes `include_interrupted=True`, after a
    comment to check the unresolved tool calls first.
    """
    if report.newest_snapshot is None:
        return []
    waiting = getattr(report, 'waiting', None)
    paused = isinstance(waiting, Waiting)
    if isinstance(waiting, Waiting) and waiting.resumed_by is None:
        return [_answer_snippet(waiting, store_url, media_hint)]
    run_id = report.run_id
    live = report.live
    # a paused history holds its deferred calls open by design: `fork_run` reads it as it is
    interrupted = report.settled_snapshot is None and not paused
    flag = ', include_interrupted=True' if interrupted else ''
    conversation = report.run.conversation_id if report.run is not None else None
    check = ''
    if not live and (interrupted or report.unresolved_effects):
        check = '# First check the unresolved tool calls listed above: each may or may not have had its effect.\n'
    imports = 'from stepcore import open_store, resolve_run'
    fork_imports = 'from stepcore import fork_run, open_store'
    if media_hint:
        imports += ', media_from_spec'
        fork_imports += ', media_from_spec'
    same = f', conversation_id={conversation!r}' if conversation else ''
    opening = _open_line(store_url, media_hint)
    resume = (
        f'{imports}\n\n{opening}\n'
        f'    resumption = await resolve_run(store, run_id={run_id!r}, agent=agent)\n'
        '    # resumption.pending: calls of tools without a recovery policy, to settle by hand first\n'
        f'    result = await resumption.run(agent{same})\n'
    )
    fork = (
        f'{fork_imports}\n\n{check}{opening}\n'
        f'    history = await fork_run(store, run_id={run_id!r}{flag})\n'
        "result = await agent.run(message_history=history, conversation_id='a-new-branch')\n"
    )
    snippets = [Snippet(title='Fork it (a new branch from the same point)', code=fork)]
    if not interrupted and _offers_resume(report):
        snippets.insert(0, Snippet(title='Resume the run (settling what a crash cut short)', code=resume))
    return snippets


def _offers_resume(report: RecoveryReport | RecoveryView) -> bool:
    """Whether resuming is the run's next step: never for a live run, one resumed already, one that
    completed, paused, was cancelled or ended otherwise (see `stepcore.recovery.standing.offers_resume`)."""
    if isinstance(report, RecoveryView):
        return report.offers_resume
    # a bare report has no status: its lease tells how the run ended, where the store keeps leases
    return offers_resume('unfinished', report.lease, resumed=report.resumed)


def _answer_snippet(waiting: Waiting, store_url: str, media_hint: str | None) -> Snippet:
    """Answer the deferred calls still waiting (approving those that need approval), then resume once."""
    imports = ['open_store', 'resume_run']
    lines: list[str] = []
    for call in waiting.unanswered():
        verb = 'approve_call' if call.kind == 'approval' else 'answer_call'
        extra = '' if call.kind == 'approval' else ', result=...'
        imports.append(verb)
        lines.append(
            f'    await {verb}(store, run_id={waiting.run_id!r}, tool_call_id={call.tool_call_id!r}{extra}, by=...)\n'
        )
    if media_hint:
        imports.append('media_from_spec')
    code = (
        f'from stepcore import {", ".join(sorted(set(imports)))}\n\n{_open_line(store_url, media_hint)}\n'
        f'{"".join(lines)}'
        f'    result = await resume_run(store, run_id={waiting.run_id!r}, agent=agent)\n'
    )
    title = 'Answer its deferred calls and resume it once' if lines else 'Resume it once: every call is answered'
    return Snippet(title=title, code=code)
