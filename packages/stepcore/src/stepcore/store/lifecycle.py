"""Listing, paging and retention of stored runs: the rules every store shares.

- **Order.** Runs are listed oldest `started_at` first; runs that started at the same instant are
  ordered by `run_id`. `newest_first=True` reverses both.
- **Paging.** Keyset paging on `(started_at, run_id)`: a page ends with the run the next page
  starts after, so runs added or deleted meanwhile never shift a page. A cursor is an opaque
  string made by `StepStore.list_runs_page`; it remembers the direction, not the filters.
- **Status.** `completed` or `failed` when the run's newest event is `run_completed` or
  `run_failed`, else `unfinished` (still running, or its process died). It is what `stepcore runs` shows.
- **Activity.** A run's last activity is the newest of its start, its events' timestamps, its
  ledger entries' `updated_at` and its snapshots' `created_at`. `StepStore.prune` removes a run
  only when both its start and its last activity are older than the cutoff, so a run still being
  written is never pruned.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, TypeAlias

from stepcore.store.models import EventKind, RunRecord, StepEvent
from stepcore.store.waiting import waits

__all__ = (
    'RUN_STATUSES',
    'Fetch',
    'PruneProgress',
    'PruneReport',
    'RunFootprint',
    'RunKey',
    'RunPage',
    'RunQuery',
    'RunStatus',
    'check_older_than',
    'collect_runs',
    'decode_cursor',
    'encode_cursor',
    'parse_duration',
    'run_key',
    'run_status',
    'sort_time',
)

RunStatus: TypeAlias = Literal['completed', 'failed', 'unfinished', 'waiting']
RUN_STATUSES: Final[tuple[RunStatus, ...]] = ('completed', 'failed', 'unfinished', 'waiting')

PruneProgress: TypeAlias = Callable[[int, int], None]
"""Called by `prune` with `(runs examined, runs to examine)`: once before the first, then after each."""

RunKey: TypeAlias = tuple[datetime, str]
"""A run's place in the listing order: `(started_at as an aware datetime, run_id)`."""

_CURSOR_TAG: Final = 'stepcore-runs-1'


def sort_time(moment: datetime) -> datetime:
    """`moment` as an aware datetime for ordering (a naive one is taken as UTC)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def run_status(events: Sequence[StepEvent]) -> RunStatus:
    """`completed`, `failed`, `unfinished` (still running, or the process died) or `waiting` (paused on
    deferred tool calls) from a run's events.

    A run's last event is `run_completed` or `run_failed` once it has ended, so the newest event
    decides; a run that goes on after a failure (a durable replay of it) is unfinished again until
    it ends. A run that ended with `DeferredToolRequests` is `waiting`: its `run_completed` event
    says so, and so do the answers recorded after it (`stepcore.store.waiting`). `events` may be
    the whole trail or only its newest event (`list_events_page(run_id, newest=True, limit=1)`).
    """
    if not events:
        return 'unfinished'
    newest = events[-1]
    kind = newest.kind
    if waits(newest):
        return 'waiting'
    if kind is EventKind.RUN_COMPLETED:
        return 'completed'
    if kind is EventKind.RUN_FAILED:
        return 'failed'
    return 'unfinished'


def run_key(run: RunRecord) -> RunKey:
    return sort_time(run.started_at), run.run_id


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of `StepStore.list_runs_page`: the runs, and the cursor of the next page (`None`: last page)."""

    runs: list[RunRecord]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class RunFootprint:
    """What a store holds for one run, as `prune` weighs it."""

    run_id: str
    events: int
    snapshots: int
    ledger_entries: int
    last_activity: datetime
    status: RunStatus


@dataclass(slots=True)
class PruneReport:
    """What `StepStore.prune` removed, or, with `dry_run=True`, would remove."""

    cutoff: datetime
    """Runs whose start and last activity are both older than this were pruned."""
    dry_run: bool
    runs: list[str] = field(default_factory=list[str])
    """The pruned runs' ids, oldest first."""
    snapshots: int = 0
    events: int = 0
    ledger_entries: int = 0
    kept_active: list[str] = field(default_factory=list[str])
    """Runs that started before the cutoff but were written to after it: still active, kept."""

    def add(self, footprint: RunFootprint) -> None:
        self.runs.append(footprint.run_id)
        self.snapshots += footprint.snapshots
        self.events += footprint.events
        self.ledger_entries += footprint.ledger_entries


_UNITS: Final = {'s': 1, 'm': 60, 'h': 3600, 'd': 86400, 'w': 7 * 86400}
_DURATION: Final = re.compile(r'(\d+)\s*([smhdw])')


def parse_duration(text: str, *, allow_zero: bool = False, option: str = 'duration') -> timedelta:
    """`30d`, `12h`, `90m`, `2w`, `45s`, or several run together (`1d12h`) as a `timedelta`.

    `0` is accepted only with `allow_zero`. `option` names the value in the error (e.g. `--grace`).
    """
    cleaned = text.strip().lower()
    if allow_zero and cleaned == '0':
        return timedelta(0)
    parts = list(_DURATION.finditer(cleaned))
    if not cleaned or not parts or ''.join(p.group(0) for p in parts) != cleaned.replace(' ', ''):
        raise ValueError(
            f'{option} {text!r} is not a duration: write a whole number and a unit '
            f'(s, m, h, d or w), e.g. 30d, 12h, 90m, 2w or 1d12h{" (or 0 for none)" if allow_zero else ""}'
        )
    seconds = sum(int(p.group(1)) * _UNITS[p.group(2)] for p in parts)
    if allow_zero:
        return timedelta(seconds=seconds)
    return check_older_than(timedelta(seconds=seconds), shown=text)


def check_older_than(value: object, *, shown: object = None) -> timedelta:
    """`value` when it is a positive `timedelta`; `ValueError` naming it otherwise."""
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ValueError(
            f'older_than {value if shown is None else shown!r} is not a positive duration: '
            'pass a timedelta longer than zero, e.g. timedelta(days=30)'
        )
    return value


def _optional_text(value: object, what: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f'{what} {value!r} is not a filter: pass a non-empty string, or None for any')
    return value


def _moment(value: object, what: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValueError(f'{what} {value!r} is not a datetime: pass a datetime (naive ones are taken as UTC)')
    return sort_time(value)


def encode_cursor(key: RunKey, *, newest_first: bool) -> str:
    started, run_id = key
    raw = json.dumps([_CURSOR_TAG, started.isoformat(), run_id, newest_first], separators=(',', ':'))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip('=')


def decode_cursor(cursor: str, *, newest_first: bool) -> RunKey:
    """The run a cursor of `list_runs_page` continues after; `ValueError` for anything else."""
    hint = 'pass the next_cursor of a list_runs_page answer unchanged, or None for the first page'
    try:
        padded = cursor + '=' * (-len(cursor) % 4)
        tag, started, run_id, direction = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if tag != _CURSOR_TAG or not isinstance(run_id, str) or not isinstance(direction, bool):
            raise ValueError('not ours')
        key = (sort_time(datetime.fromisoformat(started)), run_id)
    except (ValueError, TypeError, binascii.Error, UnicodeError):
        raise ValueError(f'cursor {cursor!r} was not made by list_runs_page: {hint}') from None
    if direction != newest_first:
        order = 'newest_first=True' if direction else 'oldest first'
        raise ValueError(f'cursor {cursor!r} pages a listing made {order}: list in the same order, or start over')
    return key


@dataclass(frozen=True, slots=True)
class RunQuery:
    """The checked arguments of one `list_runs` call."""

    conversation_id: str | None = None
    parent_run_id: str | None = None
    agent_name: str | None = None
    status: RunStatus | None = None
    started_after: datetime | None = None
    started_before: datetime | None = None
    limit: int | None = None
    after: RunKey | None = None
    """The run the listing continues after (from the cursor)."""
    newest_first: bool = False

    @classmethod
    def make(
        cls,
        *,
        conversation_id: object = None,
        parent_run_id: object = None,
        agent_name: object = None,
        status: object = None,
        started_after: object = None,
        started_before: object = None,
        limit: object = None,
        cursor: object = None,
        newest_first: object = False,
    ) -> RunQuery:
        """Check every argument (`ValueError` naming a bad one and what to pass) and decode the cursor."""
        if status is not None and status not in RUN_STATUSES:
            raise ValueError(f'status {status!r} is not a run status: use one of {", ".join(RUN_STATUSES)}, or None')
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise ValueError(f'limit {limit!r} is not a number of runs: pass an int >= 0, or None for every run')
        if not isinstance(newest_first, bool):
            raise ValueError(f'newest_first {newest_first!r} is not a bool: pass True or False')
        if cursor is not None and not isinstance(cursor, str):
            raise ValueError(f'cursor {cursor!r} is not a cursor: pass the next_cursor of a list_runs_page answer')
        return cls(
            conversation_id=_optional_text(conversation_id, 'conversation_id'),
            parent_run_id=_optional_text(parent_run_id, 'parent_run_id'),
            agent_name=_optional_text(agent_name, 'agent_name'),
            status=status,  # pyright: ignore[reportArgumentType]  # checked above
            started_after=_moment(started_after, 'started_after'),
            started_before=_moment(started_before, 'started_before'),
            limit=limit,  # pyright: ignore[reportArgumentType]  # checked above
            after=None if cursor is None else decode_cursor(cursor, newest_first=newest_first),
            newest_first=newest_first,
        )

    @property
    def needs_status(self) -> bool:
        return self.status is not None

    def beyond(self, key: RunKey) -> bool:
        """Whether a run with `key` comes after the cursor, in this listing's direction."""
        if self.after is None:
            return True
        return key < self.after if self.newest_first else key > self.after

    def admits(self, run: RunRecord) -> bool:
        """Whether `run` passes every filter but `status`, and comes after the cursor."""
        started = sort_time(run.started_at)
        return (
            (self.conversation_id is None or run.conversation_id == self.conversation_id)
            and (self.parent_run_id is None or run.parent_run_id == self.parent_run_id)
            and (self.agent_name is None or run.agent_name == self.agent_name)
            and (self.started_after is None or started > self.started_after)
            and (self.started_before is None or started < self.started_before)
            and self.beyond(run_key(run))
        )

    def ordered(self, runs: Iterable[RunRecord]) -> list[RunRecord]:
        return sorted(runs, key=run_key, reverse=self.newest_first)

    def cursor_after(self, run: RunRecord) -> str:
        return encode_cursor(run_key(run), newest_first=self.newest_first)


Fetch: TypeAlias = Callable[[RunKey | None, int | None], Awaitable[tuple[list[RunRecord], bool, RunKey | None]]]
"""Candidate runs after a key, at most about `batch` of them: `(runs, whether that was all, the key of the last
candidate in listing order)`. Candidates may include runs the query rejects; the caller filters again."""

_FILTER_BATCH: Final = 200
"""Candidates fetched at a time when filters the backend cannot apply (agent, status) thin them out."""


async def collect_runs(
    query: RunQuery, fetch: Fetch, status_of: Callable[[str], Awaitable[RunStatus]]
) -> list[RunRecord]:
    """The runs `query` asks for, from candidates fetched in keyset batches (see `Fetch`).

    Every filter is checked here again, so a backend that filters less, or not at all, still gives the
    right answer; `status` is asked of `status_of` for each candidate that passes the other filters.
    """
    found: list[RunRecord] = []
    current = query
    while True:
        want = None if query.limit is None else query.limit - len(found)
        if want == 0:
            return found
        thinned = query.status is not None or query.agent_name is not None
        batch = None if want is None else max(want, _FILTER_BATCH) if thinned else want
        candidates, complete, last = await fetch(current.after, batch)
        for run in current.ordered(r for r in candidates if current.admits(r)):
            if query.status is not None and await status_of(run.run_id) != query.status:
                continue
            found.append(run)
            if query.limit is not None and len(found) >= query.limit:
                return found
        if complete or last is None:
            return found
        current = replace(current, after=last)
