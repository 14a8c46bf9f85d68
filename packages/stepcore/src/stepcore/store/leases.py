"""Run ownership as the store keeps it: leases, the owner behind each, and the fence on a run's writes.

A run started by `StepPersistence` holds a *lease* in its store: who owns the run (host, process,
a random token), until when (the store's own clock), and an *epoch* that grows every time the run
changes hands. While it holds the lease the owner renews it on a timer; when the run ends it
releases it. Every write of the run's records is *fenced*: it is made only while the run's lease
still carries the writer's epoch, in the same transaction as the write, so a writer whose lease
was taken over (a process paused past its lease, a partitioned host) has its writes refused and
never visible. The epoch is also the run's *fencing token* for systems outside the store.

This module holds what every layer shares: the records (`Lease`, `Owner`), the states, the errors,
and the fence a writing task carries (`fencing`, `fence_of`). The mechanism is the storage engine's
(`stepcore.engine.EngineStore`: one compare-and-set primitive per backend), the policy
(claiming, renewing, orphans) `stepcore.ownership`'s.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, cast

__all__ = (
    'CANCELLED',
    'DEFAULT_LEASE_TTL',
    'HISTORY_LIMIT',
    'Change',
    'DiedAttempt',
    'Fence',
    'FencingToken',
    'Lease',
    'LeaseState',
    'Owner',
    'OwnershipChange',
    'RunCancelledError',
    'RunClaimedError',
    'RunDeadError',
    'RunFencedError',
    'RunOwnedError',
    'decode_lease_body',
    'encode_lease_body',
    'fence_of',
    'fencing',
    'from_seconds',
    'with_change',
    'with_refusal',
)

DEFAULT_LEASE_TTL = 30.0
"""Seconds a lease lasts without renewal (renewed every third of it while the run lives)."""

CANCELLED = 'cancelled'
"""The `outcome` of an `ended` lease whose run was cancelled (`stepcore.cancel_run`): never resumed.
(A `running` lease with this outcome is a run whose task was cancelled in its process, a worker
shutting down: it is an orphan, and resumed.)"""


class LeaseState(StrEnum):
    """Where a run stands as its lease says (a `str`)."""

    RUNNING = 'running'
    """An owner runs it; once its lease expires or the owner is gone, it is an orphan."""
    WAITING = 'waiting'
    """It paused on deferred tool calls (approvals, external calls) and waits for their answers."""
    PENDING = 'pending'
    """Recovery settled what it could; calls under `'ask'` wait for a person before it can resume."""
    RESUMED = 'resumed'
    """Another run (`resumed_by`) continues it: it is never resumed again."""
    DEAD = 'dead'
    """Recovery gave up on it: its resumptions died too often (`died`). Never resumed automatically;
    `stepcore.retry_run` gives it another chance."""
    ENDED = 'ended'
    """It finished (`outcome` says how): nothing owns it."""


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds a lease: a process on a host, told apart from a later one by a random token."""

    host: str
    pid: int
    token: str
    boot: str | None = None
    """The host's boot id where it has one (Linux): a process of an earlier boot is gone."""
    role: str = 'run'
    """`'run'`: the process runs the run; `'recovery'`: it claimed the run to resolve and resume it."""

    def __str__(self) -> str:
        what = ' (recovering it)' if self.role == 'recovery' else ''
        return f'{self.host} pid {self.pid}{what}'

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {'host': self.host, 'pid': self.pid, 'token': self.token, 'boot': self.boot}
        if self.role != 'run':
            data['role'] = self.role
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Owner:
        return cls(
            host=str(data['host']),
            pid=int(data['pid']),
            token=str(data['token']),
            boot=data.get('boot'),
            role=str(data.get('role', 'run')),
        )


@dataclass(frozen=True, slots=True)
class DiedAttempt:
    """A resumption of a run that died: found orphaned and claimed by recovery."""

    run_id: str
    """The resumption that died."""
    owner: str
    """Who ran it (host, pid)."""
    epoch: int
    """Its lease's epoch."""
    why: str
    """`'owner gone'` (its process exited) or `'lease expired'`."""
    at: datetime | None = None
    """When recovery found it so."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {'run': self.run_id, 'owner': self.owner, 'epoch': self.epoch, 'why': self.why}
        if self.at is not None:
            data['at'] = self.at.isoformat()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DiedAttempt:
        at = data.get('at')
        return cls(
            run_id=str(data['run']),
            owner=str(data['owner']),
            epoch=int(data['epoch']),
            why=str(data['why']),
            at=datetime.fromisoformat(at) if isinstance(at, str) else None,
        )

    def describe(self) -> str:
        return f'{self.run_id} on {self.owner}, epoch {self.epoch}, {self.why}'


class Change(StrEnum):
    """What happened to a run's ownership (`OwnershipChange.what`, a `str`)."""

    TAKEN = 'taken'
    """A new run took its first lease (a resumption: one epoch past the run it continues)."""
    TAKEN_OVER = 'taken over'
    """Another process took the run over (`previous` says from whom), raising its epoch."""
    RELEASED = 'released'
    """The owner let the run go: ended, paused, left for a person, or claimable again at once."""
    RESUMED = 'resumed'
    """The run was handed to its resumption (`detail` names it)."""
    FENCED = 'fenced'
    """Recovery raised the epoch with no owner, so a hand-over still on its way never completes."""
    REFUSED = 'refused'
    """A write by a past owner (at `epoch`) was refused by the store: a zombie stopped."""


_KINDS = {
    Change.TAKEN: 'lease_taken',
    Change.TAKEN_OVER: 'lease_taken_over',
    Change.RELEASED: 'lease_released',
    Change.RESUMED: 'lease_handed_on',
    Change.FENCED: 'lease_fenced',
    Change.REFUSED: 'write_refused',
}

HISTORY_LIMIT = 40
"""Changes a lease keeps: the first and the newest (a run claimed and let go again and again drops
the ones between)."""


@dataclass(frozen=True, slots=True)
class OwnershipChange:
    """One change of a run's ownership, kept in its lease in the same compare-and-set that made it
    (so the history is exactly what the store let happen), or, for a refused write, added by the
    writer that was refused."""

    what: Change
    at: datetime
    epoch: int
    """The lease's epoch after the change (for `refused`: the epoch the refused writer held)."""
    owner: str | None = None
    """Who acted: host, pid (and role) of the process taking, releasing, or refused."""
    previous: str | None = None
    """For `taken over`: the owner and epoch the run was taken from."""
    state: str | None = None
    """The lease's state after the change."""
    detail: str | None = None
    """Why or to what: `lease expired`, `owner gone`, an outcome, the resumption's id, ..."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {'what': self.what.value, 'at': self.at.isoformat(), 'epoch': self.epoch}
        for name in ('owner', 'previous', 'state', 'detail'):
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OwnershipChange:
        def text(name: str) -> str | None:
            value = data.get(name)
            return None if value is None else str(value)

        return cls(
            what=Change(str(data['what'])),
            at=datetime.fromisoformat(str(data['at'])),
            epoch=int(data['epoch']),
            owner=text('owner'),
            previous=text('previous'),
            state=text('state'),
            detail=text('detail'),
        )

    @property
    def kind(self) -> str:
        """The change as a kind beside a run's event kinds (`lease_taken_over`, `write_refused`, ...)."""
        return _KINDS[self.what]

    def describe(self) -> str:
        """One line: what happened, by whom, at which epoch (without the time)."""
        by = f' by {self.owner}' if self.owner else ''
        why = f' ({self.detail})' if self.detail else ''
        if self.what is Change.TAKEN:
            return f'taken{by} at epoch {self.epoch}{why}'
        if self.what is Change.TAKEN_OVER:
            source = f' from {self.previous}' if self.previous else ''
            return f'taken over{by}{source}, now epoch {self.epoch}{why}'
        if self.what is Change.RESUMED:
            return f'handed to its resumption {self.detail}{by}, epoch {self.epoch}'
        if self.what is Change.FENCED:
            return f'fenced at epoch {self.epoch}{why}'
        if self.what is Change.REFUSED:
            return f'write refused: {self.owner or "a past owner"} still held epoch {self.epoch}{why}'
        state = self.state or 'released'
        return f'released{by}: {state}{why}, epoch {self.epoch}'


def _bounded(history: tuple[OwnershipChange, ...]) -> tuple[OwnershipChange, ...]:
    if len(history) <= HISTORY_LIMIT:
        return history
    return (history[0], *history[len(history) - HISTORY_LIMIT + 1 :])


def with_change(old: Lease | None, new: Lease, *, what: Change | None = None, detail: str | None = None) -> Lease:
    """`new` (the lease about to be stored in place of `old`, `None`: the run has none) with the
    change from `old` added to its history; a renewal (same owner, state, epoch) adds none.

    `what` says what happened where the two leases alone do not (a claim let go as it was);
    otherwise it is read from them. `new` carries `old`'s history (`dataclasses.replace`)."""
    if what is None:
        if old is None:
            what = Change.TAKEN
        elif new.state is LeaseState.RESUMED and old.state is not LeaseState.RESUMED:
            what = Change.RESUMED
        elif new.epoch > old.epoch:
            what = Change.TAKEN_OVER if new.owner is not None else Change.FENCED
        elif (new.state, new.owner, new.outcome, new.note) != (old.state, old.owner, old.outcome, old.note):
            what = Change.RELEASED
        else:
            return new
    owner = new.owner if what in (Change.TAKEN, Change.TAKEN_OVER) else old.owner if old is not None else None
    previous = None
    if what is Change.TAKEN_OVER and old is not None:
        previous = f'{old.owner} at epoch {old.epoch}' if old.owner is not None else f'epoch {old.epoch}'
        if old.state is not LeaseState.RUNNING and detail is None:
            detail = f'it was {old.state.value}'
    if detail is None:
        if what is Change.TAKEN and new.resumes is not None:
            detail = f'resumes run {new.resumes}'
        elif what is Change.RESUMED:
            detail = new.resumed_by
        elif what is Change.RELEASED:
            detail = new.note or new.outcome
    change = OwnershipChange(
        what=what,
        at=new.since or datetime.now(UTC),
        epoch=new.epoch,
        owner=str(owner) if owner is not None else None,
        previous=previous,
        state=new.state.value,
        detail=detail,
    )
    return replace(new, history=_bounded((*new.history, change)))


def with_refusal(lease: Lease, *, epoch: int, owner: str) -> Lease | None:
    """`lease` with a write at `epoch` by `owner` noted as refused; `None` when its newest changes
    say so already (a writer refused again adds nothing)."""
    if any(c.what is Change.REFUSED and c.epoch == epoch and c.owner == owner for c in lease.history[-3:]):
        return None
    change = OwnershipChange(
        what=Change.REFUSED,
        at=datetime.now(UTC),
        epoch=epoch,
        owner=owner,
        state=lease.state.value,
        detail=f'the run is at epoch {lease.epoch}',
    )
    return replace(lease, history=_bounded((*lease.history, change)))


@dataclass(frozen=True, slots=True)
class Lease:
    """A run's lease as read from its store, with the store's clock at the time of reading."""

    run_id: str
    epoch: int
    """Grows by one every time the run changes hands: the fencing token of its current owner."""
    state: LeaseState
    owner: Owner | None
    expires_at: datetime
    """When the owner's hold ends unless renewed, on the store's clock."""
    checked_at: datetime
    """The store's clock when this lease was read."""
    since: datetime | None = None
    """When the current owner took it (or the run reached its state)."""
    origin: str | None = None
    """The first run of the chain of resumptions this run belongs to (itself when it resumes none)."""
    resumes: str | None = None
    """The run this one continues, when it is a resumption."""
    resumed_by: str | None = None
    """The run that continues this one (state `resumed`)."""
    outcome: str | None = None
    """How the run ended, or why it was left: `completed`, `failed`, `cancelled`, `fenced`, ..."""
    note: str | None = None
    """What recovery left for a person to do (state `pending`)."""
    version: str | None = None
    """The application version the run's chain was started by (`StepPersistence(version=...)`): the
    recovery loop resumes it only with an agent of that version."""
    job: str | None = None
    """The job the run belongs to (`stepcore.start_job`): its id is the chain's first run id (`origin`).
    Carried from run to resumption."""
    died: tuple[DiedAttempt, ...] = ()
    """The resumptions of the run's chain that died, oldest first (carried from run to resumption):
    the recovery loop stops resuming it past its `max_recovery_attempts` (state `dead`)."""
    history: tuple[OwnershipChange, ...] = ()
    """Who held the run and how it changed hands, oldest first (`OwnershipChange`): of this run
    only, not carried to a resumption."""

    @property
    def expired(self) -> bool:
        """Whether the owner's hold has ended on the store's clock (as `SwapLease` compares: strictly)."""
        return self.expires_at < self.checked_at

    @property
    def cancelled(self) -> bool:
        """Whether an operator cancelled the run (`stepcore.cancel_run`): it is never resumed."""
        return self.state is LeaseState.ENDED and self.outcome == CANCELLED

    @property
    def seconds_left(self) -> float:
        return (self.expires_at - self.checked_at).total_seconds()

    @property
    def taken_by(self) -> str | None:
        """Who took the lease first (host, pid), as its history says; else its current owner."""
        taken = next((c for c in self.history if c.what is Change.TAKEN and c.owner), None)
        if taken is not None:
            return taken.owner
        return str(self.owner) if self.owner is not None else None

    @property
    def token(self) -> FencingToken:
        return FencingToken(run_id=self.run_id, epoch=self.epoch, origin=self.origin or self.run_id)

    def describe(self) -> str:
        """One line for messages: state, owner and expiry."""
        if self.state is LeaseState.RUNNING and self.owner is not None:
            when = self.expires_at.isoformat(timespec='seconds')
            hold = f'expired at {when}' if self.expired else f'held until {when}'
            return f'running on {self.owner}, epoch {self.epoch}, {hold}'
        ended = f'{self.state.value} ({self.outcome})' if self.outcome else self.state.value
        return f'resumed by run {self.resumed_by!r}' if self.state is LeaseState.RESUMED else ended

    def headline(self) -> str:
        """`describe()` with the lease's epoch, said once, for a heading over its history."""
        running = self.state is LeaseState.RUNNING and self.owner is not None  # its words name the epoch
        return self.describe() + ('' if running else f', epoch {self.epoch}')


@dataclass(frozen=True, slots=True)
class FencingToken:
    """What a tool hands to a system outside the store so it can refuse a writer that lost its run.

    `epoch` grows along a run and along its resumptions (a resumption starts one past the run it
    continues), so a downstream system that remembers the highest epoch it saw for `origin` and
    refuses anything lower refuses every zombie of that chain.
    """

    run_id: str
    epoch: int
    origin: str


def from_seconds(seconds: float) -> datetime:
    """Seconds since the Unix epoch as an aware UTC datetime."""
    return datetime.fromtimestamp(seconds, UTC)


def encode_lease_body(lease: Lease) -> str:
    """The parts of a lease a port keeps in its opaque body column (compact JSON)."""
    data: dict[str, Any] = {
        'owner': lease.owner.to_json() if lease.owner is not None else None,
        'since': lease.since.isoformat() if lease.since is not None else None,
        'origin': lease.origin,
        'resumes': lease.resumes,
        'resumed_by': lease.resumed_by,
        'outcome': lease.outcome,
        'note': lease.note,
        'version': lease.version,
        'job': lease.job,
        'died': [attempt.to_json() for attempt in lease.died] or None,
        'history': [change.to_json() for change in lease.history] or None,
    }
    return json.dumps({k: v for k, v in data.items() if v is not None}, separators=(',', ':'))


def decode_lease_body(
    run_id: str, epoch: int, state: str, expires: float, now: float, body: str | bytes | Mapping[str, Any]
) -> Lease:
    """A `Lease` from a port's row; `ValueError` naming what does not parse."""
    data: Any = body if isinstance(body, Mapping) else json.loads(body)
    if not isinstance(data, dict):
        raise ValueError(f'lease body is {type(data).__name__}, not an object')
    fields = cast(dict[str, Any], data)
    owner = fields.get('owner')
    since = fields.get('since')
    return Lease(
        run_id=run_id,
        epoch=int(epoch),
        state=LeaseState(state),
        owner=Owner.from_json(owner) if isinstance(owner, dict) else None,
        expires_at=from_seconds(float(expires)),
        checked_at=from_seconds(float(now)),
        since=datetime.fromisoformat(since) if isinstance(since, str) else None,
        origin=fields.get('origin'),
        resumes=fields.get('resumes'),
        resumed_by=fields.get('resumed_by'),
        outcome=fields.get('outcome'),
        note=fields.get('note'),
        version=fields.get('version'),
        job=fields.get('job'),
        died=tuple(DiedAttempt.from_json(a) for a in cast(list[Any], fields.get('died') or []) if isinstance(a, dict)),
        history=_history(fields.get('history')),
    )


def _history(stored: object) -> tuple[OwnershipChange, ...]:
    """A lease body's ownership history; a change this release cannot read (a kind a later one added)
    is left out, not taken for damage: the history tells, it never decides."""
    changes: list[OwnershipChange] = []
    for item in cast(list[Any], stored) if isinstance(stored, list) else []:
        if isinstance(item, dict):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                changes.append(OwnershipChange.from_json(cast(dict[str, Any], item)))
    return tuple(changes)


# --- errors ---------------------------------------------------------------------------------------


class RunOwnedError(RuntimeError):
    """The run is held by a live owner: recovery must not act on it."""

    def __init__(self, lease: Lease, *, action: str) -> None:
        owner = lease.owner
        who = f'{owner}' if owner is not None else 'an unknown owner'
        until = lease.expires_at.isoformat(timespec='seconds')
        super().__init__(
            f'run {lease.run_id!r} is running on {who}, lease epoch {lease.epoch}, held until {until} '
            f'({max(lease.seconds_left, 0):.0f} s from now): {action} would act on a live run. Wait until it ends '
            f'or its lease expires, or pass force=True (--force) if you know that process is gone'
        )
        self.lease = lease


class RunClaimedError(RuntimeError):
    """Another worker claimed the run first (or took it over meanwhile)."""

    def __init__(self, run_id: str, lease: Lease | None, *, action: str) -> None:
        if lease is None:
            detail = 'its lease is gone'
        elif lease.state is LeaseState.RESUMED:
            detail = f'it was resumed by run {lease.resumed_by!r}'
        elif lease.owner is not None:
            since = f' since {lease.since.isoformat(timespec="seconds")}' if lease.since is not None else ''
            detail = f'claimed by {lease.owner} at epoch {lease.epoch}{since}'
        else:
            detail = f'it is {lease.describe()}'
        super().__init__(f'run {run_id!r} cannot be {action}: {detail}')
        self.run_id = run_id
        self.lease = lease


class RunCancelledError(RunClaimedError):
    """The run was cancelled (`stepcore.cancel_run`): nothing resumes, settles or answers it."""

    def __init__(self, lease: Lease, *, action: str) -> None:
        RuntimeError.__init__(
            self,
            f'run {lease.run_id!r} cannot be {action}: it was {lease.note or CANCELLED}, '
            'and a cancelled run is never resumed',
        )
        self.run_id = lease.run_id
        self.lease = lease


class RunDeadError(RuntimeError):
    """Recovery gave up on the run: its resumptions died `max_recovery_attempts` times (see `Lease.died`)."""

    def __init__(self, lease: Lease) -> None:
        attempts = '; '.join(a.describe() for a in lease.died)
        super().__init__(
            f'run {lease.run_id!r} is dead: {len(lease.died)} resumptions of it died ({attempts}). It is not resumed '
            'automatically any more: find what kills its worker, then give it another chance with retry_run '
            f'(stepcore recover {lease.run_id} --retry)'
        )
        self.run_id = lease.run_id
        self.lease = lease


class RunFencedError(RuntimeError):
    """A write of a run whose lease was taken over: refused, and nothing of it stored."""

    def __init__(self, run_id: str, epoch: int, lease: Lease | None) -> None:
        if lease is None:
            now = 'the run no longer has a lease (it was deleted)'
        elif lease.cancelled:
            now = f'it was {lease.note or CANCELLED} at lease epoch {lease.epoch}'
        elif lease.owner is not None and lease.epoch != epoch:
            since = f' at {lease.since.isoformat(timespec="seconds")}' if lease.since is not None else ''
            now = f'it was taken over by {lease.owner} at epoch {lease.epoch}{since}'
        else:
            now = f'its lease is now epoch {lease.epoch}, {lease.describe()}'
        super().__init__(
            f'write refused: this process held run {run_id!r} at lease epoch {epoch}, and {now}. '
            'The run stops here; its new owner carries it on'
        )
        self.run_id = run_id
        self.epoch = epoch
        self.lease = lease


# --- the fence a writing task carries -------------------------------------------------------------


@dataclass(slots=True)
class Fence:
    """The lease a task writes a run's records under: its epoch, once claimed (`None`: not fenced)."""

    run_id: str
    epoch: int | None = None
    origin: str | None = None
    lost: Lease | None = field(default=None)
    """Set once the owner learns its lease was taken over."""
    store: Any = field(default=None, repr=False)
    """The store holding the lease, where `stepcore.check_fencing_token` reads it (`None`: unknown)."""

    @property
    def token(self) -> FencingToken | None:
        if self.epoch is None:
            return None
        return FencingToken(run_id=self.run_id, epoch=self.epoch, origin=self.origin or self.run_id)


_NO_FENCES: Mapping[str, Fence] = MappingProxyType({})
_FENCES: ContextVar[Mapping[str, Fence]] = ContextVar('stepcore_fences', default=_NO_FENCES)


@contextmanager
def fencing(fence: Fence) -> Iterator[Fence]:
    """Write `fence.run_id`'s records under `fence` in this context (and the tasks it starts)."""
    token = _FENCES.set({**_FENCES.get(), fence.run_id: fence})
    try:
        yield fence
    finally:
        _FENCES.reset(token)


def fence_of(run_id: str) -> int | None:
    """The epoch this task writes `run_id` under, or `None` when its writes are not fenced."""
    fence = _FENCES.get().get(run_id)
    return None if fence is None else fence.epoch


def current_fences() -> Mapping[str, Fence]:
    """Every fence of this context, by run id (the innermost run's last)."""
    return _FENCES.get()
