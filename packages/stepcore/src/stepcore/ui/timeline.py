"""A run's timeline: its events in order, each end paired with its start, and the changes of its
ownership among them by time, a page at a time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from stepcore.store.leases import OwnershipChange
from stepcore.store.lifecycle import sort_time
from stepcore.store.models import EventKind, StepEvent
from stepcore.store.step_store import StepStore
from stepcore.store.waiting import Answer, answer_of, is_answer
from stepcore.ui.queries import Page, RunFacts, page_of, run_facts

__all__ = (
    'ANSWERED',
    'EVENTS_PER_PAGE',
    'PAIRING_WINDOW',
    'ChangeRow',
    'TimelineRow',
    'merge_by_time',
    'timeline',
    'timeline_page',
)

EVENTS_PER_PAGE = 100
PAIRING_WINDOW = 200
"""Events read before and after a timeline page to pair the starts and ends that cross its edges."""
ANSWERED = 'call_answered'
"""The kind the timeline shows an answer to a deferred call under (stored as `tool_call_completed`)."""


@dataclass(frozen=True, kw_only=True)
class TimelineRow:
    event: StepEvent
    offset: timedelta | None
    """Time since the run's first event."""
    duration: timedelta | None = None
    """On an event that ends something (a model request, a tool call, the run): how long it took."""
    ends_seq: int | None = None
    """The seq of the event it ends."""
    open: bool = False
    """A start that nothing ended: still going, or cut short by a crash."""
    answer: Answer | None = None
    """On an answer to a deferred call (stored as `tool_call_completed`): the answer."""

    @property
    def kind(self) -> str:
        """The event's kind as the timeline shows it: an answer is `call_answered`, not a tool call's end."""
        return ANSWERED if self.answer is not None else self.event.kind.value

    @property
    def is_change(self) -> bool:
        """A step event, not a change of the run's ownership."""
        return False


@dataclass(frozen=True, kw_only=True)
class ChangeRow:
    """A change of the run's ownership, shown among its events by time."""

    change: OwnershipChange
    index: int
    """Its place in the lease's history (from 1)."""
    offset: timedelta | None
    """Time since the run's first event (negative for a lease taken before it)."""

    @property
    def kind(self) -> str:
        """`lease_taken`, `lease_taken_over`, `write_refused`, ... (see `OwnershipChange.kind`)."""
        return self.change.kind

    @property
    def is_change(self) -> bool:
        return True


_ENDS = {
    EventKind.MODEL_REQUEST_COMPLETED: EventKind.MODEL_REQUEST_STARTED,
    EventKind.MODEL_REQUEST_FAILED: EventKind.MODEL_REQUEST_STARTED,
    EventKind.TOOL_CALL_COMPLETED: EventKind.TOOL_CALL_STARTED,
    EventKind.TOOL_CALL_FAILED: EventKind.TOOL_CALL_STARTED,
    EventKind.RUN_COMPLETED: EventKind.RUN_STARTED,
    EventKind.RUN_FAILED: EventKind.RUN_STARTED,
}


_STARTS = frozenset(_ENDS.values())


def timeline(events: Sequence[StepEvent], start: int = 0, end: int | None = None) -> list[TimelineRow]:
    """Rows for `events[start:end]`: each event's offset from the first, and on an end the time since its start.

    Ends are paired with their starts over all of `events` (a start may sit on an earlier page), in
    one pass that only compares kinds and tool call ids; times are computed for the slice only.
    """
    if not events:
        return []
    end = len(events) if end is None else end
    waiting: dict[object, int] = {}
    start_of: dict[int, int] = {}
    closed: set[int] = set()
    for index, event in enumerate(events):
        kind = event.kind
        if kind in _STARTS:
            waiting[(kind, event.tool_call_id) if kind is EventKind.TOOL_CALL_STARTED else kind] = index
            continue
        opener = _ENDS.get(kind)
        if opener is None or is_answer(event):  # an answer ends no call of the tool
            continue
        key = (opener, event.tool_call_id) if opener is EventKind.TOOL_CALL_STARTED else opener
        begin = waiting.pop(key, None)
        if begin is not None:
            closed.add(begin)
            if start <= index < end:
                start_of[index] = begin
    first = sort_time(events[0].timestamp)
    rows: list[TimelineRow] = []
    for index in range(start, min(end, len(events))):
        event = events[index]
        moment = sort_time(event.timestamp)
        begin = start_of.get(index)
        rows.append(
            TimelineRow(
                event=event,
                offset=moment - first,
                duration=None if begin is None else moment - sort_time(events[begin].timestamp),
                ends_seq=None if begin is None else events[begin].seq,
                open=event.kind in _STARTS and index not in closed,
                answer=answer_of(event),
            )
        )
    return rows


async def timeline_page(
    store: StepStore,
    run_id: str,
    number: int,
    size: int = EVENTS_PER_PAGE,
    changes: Sequence[OwnershipChange] = (),
) -> tuple[list[TimelineRow | ChangeRow], Page, RunFacts]:
    """Page `number` of the run's timeline: its rows, where it sits, and the run's facts.

    The ownership `changes` (its lease's history) are merged into the events by time: a page shows
    those from its first event up to the next page's first (the first page also those before the
    run's first event, the last those after its last)."""
    facts = await run_facts(store, run_id)
    page = page_of(number, size, facts.event_count)
    if not facts.event_count:
        return [ChangeRow(change=c, index=i, offset=None) for i, c in enumerate(changes, 1)], page, facts
    # Page n holds the events with seq in ((n - 1) * size, n * size]; read a margin on either side.
    after = max(0, page.start - PAIRING_WINDOW)
    window = await store.list_events_page(run_id, after_seq=after, limit=page.end - after + PAIRING_WINDOW)
    if after > 0:
        window = [*await store.list_events_page(run_id, limit=1), *window]  # the origin of the offsets
    start = next((i for i, e in enumerate(window) if (e.seq or 0) > page.start), len(window))
    end = next((i for i, e in enumerate(window) if (e.seq or 0) > page.end), len(window))
    rows = timeline(window, start, end)
    first = sort_time(window[0].timestamp)
    low = sort_time(window[start].timestamp) if page.number > 1 and start < len(window) else None
    high = sort_time(window[end].timestamp) if end < len(window) else None
    shown = [
        ChangeRow(change=c, index=i, offset=sort_time(c.at) - first)
        for i, c in enumerate(changes, 1)
        if (low is None or sort_time(c.at) >= low) and (high is None or sort_time(c.at) < high)
    ]
    return merge_by_time(rows, shown), page, facts


def merge_by_time(rows: Sequence[TimelineRow], changes: Sequence[ChangeRow]) -> list[TimelineRow | ChangeRow]:
    """The event rows in their order, each change before the first event that happened after it."""
    merged: list[TimelineRow | ChangeRow] = []
    waiting = sorted(changes, key=lambda r: (sort_time(r.change.at), r.index))
    for row in rows:
        moment = sort_time(row.event.timestamp)
        while waiting and sort_time(waiting[0].change.at) < moment:
            merged.append(waiting.pop(0))
        merged.append(row)
    return [*merged, *waiting]
