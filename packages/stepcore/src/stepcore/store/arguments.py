"""Checking the arguments of the store's reads and writes, and cutting windows out of what was read."""

from __future__ import annotations

from collections.abc import Sequence

from stepcore.store.models import StepEvent, ToolEffectRecord
from stepcore.store.protocols import StepWrite

__all__ = (
    'check_event_window',
    'check_message_window',
    'check_seq',
    'check_writes',
    'event_window',
    'shared_prefix',
)


def check_event_window(after_seq: object, limit: object) -> None:
    """`ValueError` naming a bad `after_seq` / `limit` of `StepStore.list_events_page`."""
    if after_seq is not None and (isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0):
        raise ValueError(
            f'after_seq={after_seq!r} is not a sequence number: pass the seq of the last event you have (0 or more), '
            'or None to start at the first event'
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f'limit={limit!r} is not a positive whole number: pass how many events you want, or None')


def check_seq(seq: object) -> None:
    """`ValueError` naming a `seq` of `StepStore.get_snapshot` that is not a whole number."""
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise ValueError(f'seq={seq!r} is not a snapshot sequence number: pass the `seq` of a stored snapshot')


def check_message_window(start: object, stop: object) -> None:
    """`ValueError` naming a bad `start` / `stop` of `StepStore.get_snapshot_messages`."""
    for name, value in (('start', start), ('stop', stop)):
        if value is None and name == 'stop':
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f'{name}={value!r} is not a message position: pass a whole number of 0 or more '
                "(positions count a snapshot's messages from 0, oldest first)"
                + (', or None for the end' if name == 'stop' else '')
            )


def shared_prefix(first: Sequence[object], second: Sequence[object]) -> int:
    """How many leading items two sequences have equal."""
    count = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        count += 1
    return count


def event_window(
    events: Sequence[StepEvent], after_seq: int | None, limit: int | None, newest: bool
) -> list[StepEvent]:
    """The events `list_events_page` answers, cut from the run's events in append order."""
    found = [e for e in events if after_seq is None or (e.seq is not None and e.seq > after_seq)]
    if limit is None:
        return found
    return found[-limit:] if newest else found[:limit]


def check_writes(writes: Sequence[object]) -> Sequence[StepWrite]:
    """`writes` unchanged when every item is a `StepEvent` or `ToolEffectRecord`; `TypeError` otherwise.

    `write_batch` calls it first, so a bad batch is refused before anything is written.
    """
    for index, write in enumerate(writes):
        if not isinstance(write, StepEvent | ToolEffectRecord):
            raise TypeError(
                f'write_batch got {type(write).__name__} at position {index}: '
                'pass StepEvent and ToolEffectRecord objects only (snapshots go through save_snapshot)'
            )
    return writes  # pyright: ignore[reportReturnType]  # checked item by item above
