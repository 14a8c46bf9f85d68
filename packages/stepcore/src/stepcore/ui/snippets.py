"""Copyable Python for resuming or branching a run, as the recovery report suggests."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from ..recovery import RecoveryReport
from .queries import RecoveryView

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
    """`continue_run` and `fork_run` calls for the run, or nothing when it has no snapshot to start from.

    With no settled snapshot, the calls pass `include_interrupted=True`, after a comment to check
    the unresolved tool calls first.
    """
    if report.newest_snapshot is None:
        return []
    run_id = report.run_id
    interrupted = report.settled_snapshot is None
    flag = ', include_interrupted=True' if interrupted else ''
    conversation = report.run.conversation_id if report.run is not None else None
    check = ''
    if interrupted or report.unresolved_effects:
        check = '# First check the unresolved tool calls listed above: each may or may not have had its effect.\n'
    imports = 'from stepcore import continue_run, open_store'
    fork_imports = 'from stepcore import fork_run, open_store'
    if media_hint:
        imports += ', media_from_spec'
        fork_imports += ', media_from_spec'
    same = f', conversation_id={conversation!r}' if conversation else ''
    opening = _open_line(store_url, media_hint)
    resume = (
        f'{imports}\n\n{check}{opening}\n'
        f'    history = await continue_run(store, run_id={run_id!r}{flag})\n'
        f'result = await agent.run(message_history=history{same})\n'
    )
    fork = (
        f'{fork_imports}\n\n{check}{opening}\n'
        f'    history = await fork_run(store, run_id={run_id!r}{flag})\n'
        "result = await agent.run(message_history=history, conversation_id='a-new-branch')\n"
    )
    return [
        Snippet(title='Continue the run (same conversation)', code=resume),
        Snippet(title='Fork it (a new branch from the same point)', code=fork),
    ]
