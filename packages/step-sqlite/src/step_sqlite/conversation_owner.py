"""Which local process owns a running conversation, and refusing to take it from a live one.

A process takes a conversation by saving it as `'running'` with its process id (`save(...,
in_progress=True)` does both). Another process may take it over only once that process is gone.
This is a local check, not a lease: the database must not be shared between hosts, and a process
id the system has handed to another program since counts as alive (the safe mistake). The probe is
the one run ownership uses on one host (`stepcore.ownership.process_alive`).
"""

from __future__ import annotations

from stepcore.backend import process_alive

from .conversation_models import ConversationConflict, ConversationSummary

__all__ = ('ensure_inactive', 'process_alive', 'running_owner')


def running_owner(summary: ConversationSummary) -> int | None:
    """The id of the live process the conversation is running in, or `None` when no process holds it."""
    pid = summary.writer_pid
    if summary.outcome != 'running' or pid is None or not process_alive(pid):
        return None
    return pid


def ensure_inactive(summary: ConversationSummary) -> None:
    """Raise `ConversationConflict` if the conversation is running in a process still alive here.

    Call it on a freshly read summary before resuming a conversation in this process. A
    conversation whose owner has exited (or was killed) passes, and may be taken over. The current
    process counts like any other: a conversation it is running itself is not inactive.
    """
    pid = running_owner(summary)
    if pid is not None:
        raise ConversationConflict(
            summary.conversation_id,
            f'it is running in process {pid} on this machine, so it is busy: wait for that process to finish or '
            'stop it, then read the conversation again (a process id reused by another program also counts as '
            'running)',
        )
