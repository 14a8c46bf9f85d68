"""Run registration rules shared by every store."""

from __future__ import annotations

from stepcore.store.models import RunRecord

__all__ = ('check_registration', 'duplicate_run_error')


def duplicate_run_error(run_id: str) -> ValueError:
    """The error for a run id that is already registered by another registration."""
    return ValueError(
        f'run_id {run_id!r} is already in the store (registered by another run): each Agent.run needs its own '
        'run_id (use conversation_id= to group several runs)'
    )


def check_registration(existing: RunRecord | None, record: RunRecord) -> bool:
    """Decide a registration against the stored record.

    Returns True when `record` should be stored, False when it is a retry of the stored
    registration (same non-None `registration_id`), and raises `ValueError` for any other reuse.
    """
    if existing is None:
        return True
    if record.registration_id is not None and existing.registration_id == record.registration_id:
        return False
    raise duplicate_run_error(record.run_id)
