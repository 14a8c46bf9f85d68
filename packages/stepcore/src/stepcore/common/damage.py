"""Damaged records: what a reader raises, and how listings pass over them.

A stored record that cannot be read affects only the reads that need it. Reading it raises
`DamagedRecordError`, a `ValueError` naming the run and the record; a listing skips it and logs a
warning saying the same, at one level for every store. Nothing is hidden silently: a ledger entry
that cannot be read is always an error, because leaving it out could hide an effect in flight.

A damaged record is one of two kinds, and the error and the warning say which:

- `unreadable`: its bytes could not be had at all (an I/O error, a directory where a file should
  be). A port hands such a record over with an `ops.Unreadable` body.
- `unparsable`: its bytes were read but do not decode (bad JSON, fields that do not validate, a
  message chain with a node missing, a port's own framing broken: `ops.Unparsable`).

A record whose fields do not validate is `WrongTypes`, told in pydantic-ai-harness's words
(`stepcore.store.codec.validated`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final, Literal, TypeVar

from stepcore.common.telemetry import damaged_record

__all__ = (
    'UNPARSABLE',
    'UNREADABLE',
    'DamageKind',
    'DamagedRecordError',
    'UnreadableBody',
    'WrongTypes',
    'decoded',
    'logger',
    'skip_damaged',
    'warnings_logged',
)

T = TypeVar('T')
R = TypeVar('R')

logger = logging.getLogger('stepcore.engine')

DamageKind = Literal['unreadable', 'unparsable']
UNREADABLE: Final = 'unreadable'
"""The record's bytes could not be read."""
UNPARSABLE: Final = 'unparsable'
"""The record's bytes were read but do not decode into the record."""


class DamagedRecordError(ValueError):
    """A stored record that cannot be read. `run_id` and `record` say which one, `kind` how it failed."""

    def __init__(
        self, *, run_id: str | None, record: str, where: str, reason: str, kind: DamageKind = UNPARSABLE
    ) -> None:
        of_run = f' of run {run_id!r}' if run_id is not None else ''
        super().__init__(f'{record}{of_run} in {where} is {kind}: {reason}')
        self.run_id = run_id
        self.record = record
        self.where = where
        self.reason = reason
        self.kind: DamageKind = kind
        damaged_record(run_id, record, kind)


class UnreadableBody(Exception):
    """Raised while decoding a record whose port could not read its bytes (an `ops.Unreadable` body)."""


class WrongTypes(ValueError):
    """A stored record that parses but whose fields do not validate as that record; the message names
    the record's kind, the fields at fault and the values found (see `validated`)."""


def _reason(error: BaseException) -> str:
    text = str(error).strip().replace('\n', ' ')
    if len(text) > 300:
        text = text[:300] + '...'
    if isinstance(error, WrongTypes):
        return text  # it names the record's kind and its fields at fault itself
    return f'{type(error).__name__}: {text}' if text else type(error).__name__


def decoded(read: Callable[[], T], *, run_id: str | None, record: str, where: str) -> T:
    """`read()`, with any failure to read or decode turned into a `DamagedRecordError` naming the record.

    `UnreadableBody` and operating-system errors make it `unreadable`; decoding errors `unparsable`.
    """
    try:
        return read()
    except DamagedRecordError:
        raise
    except UnreadableBody as error:
        raise DamagedRecordError(
            run_id=run_id, record=record, where=where, reason=str(error), kind=UNREADABLE
        ) from error
    except OSError as error:
        raise DamagedRecordError(
            run_id=run_id, record=record, where=where, reason=_reason(error), kind=UNREADABLE
        ) from error
    except (ValueError, TypeError, KeyError, LookupError, UnicodeError) as error:
        raise DamagedRecordError(run_id=run_id, record=record, where=where, reason=_reason(error)) from error


def skip_damaged(error: DamagedRecordError) -> None:
    """Log a damaged record that a listing leaves out, saying whether it is unreadable or unparsable."""
    logger.warning('skipping an %s record: %s', error.kind, error)


@contextmanager
def warnings_logged() -> Iterator[list[logging.LogRecord]]:
    """Collect the WARNING (and higher) records logged anywhere while the block runs: a listing that
    leaves a damaged record out says so here, and so does a backend on its own logger."""
    found: list[logging.LogRecord] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found.append(record)

    handler = _Collect(level=logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield found
    finally:
        root.removeHandler(handler)
