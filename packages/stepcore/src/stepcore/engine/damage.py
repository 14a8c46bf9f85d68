"""Damaged records: what a reader raises, and how listings pass over them.

A stored record that cannot be read (bad bytes, bad JSON, fields that do not validate, a message
chain with a node missing) affects only the reads that need it. Reading it raises
`DamagedRecordError`, a `ValueError` naming the run and the record; a listing skips it and logs a
warning saying the same, at one level for every store. Nothing is hidden silently: a ledger entry
that cannot be read is always an error, because leaving it out could hide an effect in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

__all__ = ('DamagedRecordError', 'decoded', 'logger', 'skip_damaged')

T = TypeVar('T')

logger = logging.getLogger('stepcore.engine')


class DamagedRecordError(ValueError):
    """A stored record that cannot be read. `run_id` and `record` say which one."""

    def __init__(self, *, run_id: str | None, record: str, where: str, reason: str) -> None:
        of_run = f' of run {run_id!r}' if run_id is not None else ''
        super().__init__(f'{record}{of_run} in {where} cannot be read: {reason}')
        self.run_id = run_id
        self.record = record
        self.where = where
        self.reason = reason


def _reason(error: BaseException) -> str:
    text = str(error).strip().replace('\n', ' ')
    if len(text) > 300:
        text = text[:300] + '...'
    return f'{type(error).__name__}: {text}' if text else type(error).__name__


def decoded(read: Callable[[], T], *, run_id: str | None, record: str, where: str) -> T:
    """`read()`, with any failure to decode turned into a `DamagedRecordError` naming the record."""
    try:
        return read()
    except DamagedRecordError:
        raise
    except (ValueError, TypeError, KeyError, LookupError, UnicodeError) as error:
        raise DamagedRecordError(run_id=run_id, record=record, where=where, reason=_reason(error)) from error


def skip_damaged(error: DamagedRecordError) -> None:
    """Log a damaged record that a listing leaves out."""
    logger.warning('skipping a damaged record: %s', error)
