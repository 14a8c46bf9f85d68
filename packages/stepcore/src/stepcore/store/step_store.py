"""`StepStore`: the contract every step store keeps, as a base class with its derived methods written once."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self, cast

from pydantic_ai.messages import ModelMessage

from stepcore.media.walker import payload_addresses
from stepcore.store.codec import encode_message
from stepcore.store.leases import Lease, LeaseState
from stepcore.store.lifecycle import (
    PruneProgress,
    PruneReport,
    RunFootprint,
    RunPage,
    RunQuery,
    RunStatus,
    check_older_than,
    run_status,
    sort_time,
)
from stepcore.store.models import (
    ContinuableSnapshot,
    RunRecord,
    SnapshotMessages,
    SnapshotSummary,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
    utcnow,
)

if TYPE_CHECKING:
    from stepcore.common.encryption import Encryption

from stepcore.store.adapters import paged, takes_keywords
from stepcore.store.arguments import (
    check_event_window,
    check_message_window,
    check_seq,
    check_writes,
    event_window,
    shared_prefix,
)
from stepcore.store.protocols import CONTRACT_METHODS, StepWrite

__all__ = ('StepStore',)


def _defines(cls: type, name: str) -> bool:
    """Whether `cls` or a class it inherits from defines `name` (never through `__getattr__`)."""
    return any(name in vars(klass) for klass in cls.__mro__)


def _overrides(store: object, name: str) -> bool:
    """Whether the store's class defines `name` below `StepStore` (the base's default does not count)."""
    for klass in type(store).__mro__:
        if klass is StepStore:
            return False
        if name in vars(klass):
            return True
    return False


def _missing(store: object, method: str, purpose: str) -> NotImplementedError:
    return NotImplementedError(
        f'{type(store).__name__} does not implement {method}, which stepcore needs {purpose}: '
        f'implement {method} on the store'
    )


class StepStore(ABC):
    """Async persistence for runs, step events, snapshots and the tool-effect ledger.

    The contract is the reference's protocol (`StepStoreProtocol`): `register_run`, `get_run`,
    `list_runs`, `append_event`, `list_events`, `save_snapshot`, `latest_snapshot`,
    `record_tool_effect`, `get_tool_effect` and `list_unresolved_tool_effects`. A class with those
    methods works as a store without subclassing anything (`isinstance(obj, StepStore)` holds for
    it, and stepcore reaches it through `stepcore.store.contract.as_step_store`).

    Subclass it to have the rest: implement the abstract methods (a class that leaves one out
    cannot be instantiated) and the reads (`latest_snapshot` or `list_snapshots`;
    `get_tool_effect` and `list_unresolved_tool_effects`, or `list_tool_effects`), or subclass
    `stepcore.engine.EngineStore`, which implements everything over a small I/O port. Every other
    method is an extension with a default here, derived from the contract, which a store overrides
    to be faster; stepcore uses a store's own extension only where no contract method it stands in
    for is overridden below it (see `stepcore.store.contract`). An extension that cannot be derived
    (`delete_run`, listing every snapshot or ledger entry) raises `NotImplementedError` by default.

    Guarantees every store keeps (checked by `stepcore-conformance`):

    - `register_run` raises `ValueError` for a run id already registered, unless the stored record
      carries the same non-`None` `registration_id` (a retried registration), which is a no-op.
    - `list_runs` filters combine with AND and results are sorted by `started_at` ascending, runs
      that started at the same instant by `run_id`; `limit` and `cursor` page that order (keyset on
      `(started_at, run_id)`, see `stepcore.store.lifecycle`).
    - Events and snapshots with an `idempotency_key` the run already applied are suppressed;
      a `None` key always appends. Events keep their append order within a run.
    - `save_snapshot` copies: mutating the messages afterwards does not change what is stored.
      The store assigns a per-run monotonic `seq`.
    - `latest_snapshot` returns the newest `complete` snapshot, or the newest of any state with
      `include_interrupted=True`; `None` when there is none. `list_snapshots` filters the same
      way: the `complete` snapshots by default, all of them with `include_interrupted=True`, in
      write order.
    - `record_tool_effect` upserts on `(run_id, tool_call_id)`: the latest write wins.
    - `write_batch` writes its snapshot before its records, atomically where the backend can: a
      `completed` ledger entry never becomes durable before the snapshot that holds its result.
    - With `max_snapshots_per_run=N`, each save prunes the run to the newest N snapshots plus the
      newest snapshot overall and the newest complete one.
    - `delete_run` removes the run's record, events, snapshots and ledger; `delete_conversation`
      and `prune` remove whole runs through it.

    Stores are async context managers: `async with SomeStore(...) as store:` closes it on exit.

    Users subclass stores: a store class keeps its own state and helpers in name-mangled
    attributes (`self.__name`), so a subclass's `self._driver` or `self._db` never replaces them.
    The hooks below with a single underscore (`_prune_run`, `_run_footprint`, `_status_of`) are the
    only private names a store class shares with its subclasses.
    """

    features: ClassVar[frozenset[str]] = frozenset()
    """Optional behaviours this backend provides (see `stepcore.common.features`), declared once, here."""

    implied_features: ClassVar[frozenset[str]] = frozenset()
    """Features every subclass has, whatever its own `features` says (`EngineStore`: `engine_port`)."""

    encryption: Encryption | None = None
    """The keys the store seals bodies and blobs with (`None`: it stores them in clear). Only a store
    declaring the feature `encryption` sets it."""

    # -- runs ---------------------------------------------------------------------------------

    @abstractmethod
    async def register_run(self, record: RunRecord) -> None:
        """Store a new run's record; `ValueError` if the run id is taken by another registration."""

    @abstractmethod
    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or `None`."""

    @abstractmethod
    async def list_runs(
        self,
        *,
        conversation_id: str | None = None,
        parent_run_id: str | None = None,
        agent_name: str | None = None,
        status: RunStatus | None = None,
        started_after: datetime | None = None,
        started_before: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        newest_first: bool = False,
    ) -> list[RunRecord]:
        """Runs matching every given filter, oldest `started_at` first (ties by `run_id`).

        `status` is `completed`, `failed`, `unfinished` or `waiting` (see `stepcore.store.lifecycle.run_status`);
        `started_after` / `started_before` bound `started_at`, both exclusive. `limit` answers at
        most that many; `cursor` (from `list_runs_page`) continues after the run it names;
        `newest_first=True` lists in the opposite order. A bad value raises `ValueError` naming it.

        A store written to the reference's signature (only `conversation_id` and `parent_run_id`)
        still works: the other arguments are applied over its answer (`stepcore.store.adapters`).
        """

    async def list_runs_page(
        self,
        *,
        conversation_id: str | None = None,
        parent_run_id: str | None = None,
        agent_name: str | None = None,
        status: RunStatus | None = None,
        started_after: datetime | None = None,
        started_before: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        newest_first: bool = False,
    ) -> RunPage:
        """One page of `list_runs`: at most `limit` runs and the cursor of the next page (`None` after the last).

        Pass `next_cursor` back as `cursor`, with the same filters and order, for the next page.
        Paging is by key, not by position: runs added or removed meanwhile do not shift a page.
        """
        query = RunQuery.make(
            conversation_id=conversation_id,
            parent_run_id=parent_run_id,
            agent_name=agent_name,
            status=status,
            started_after=started_after,
            started_before=started_before,
            limit=limit,
            cursor=cursor,
            newest_first=newest_first,
        )
        if limit < 1:
            raise ValueError(f'limit {limit!r} is not a page size: pass an int >= 1')
        runs = await self.list_runs(
            conversation_id=conversation_id,
            parent_run_id=parent_run_id,
            agent_name=agent_name,
            status=status,
            started_after=started_after,
            started_before=started_before,
            limit=limit + 1,
            cursor=cursor,
            newest_first=newest_first,
        )
        if len(runs) <= limit:
            return RunPage(runs, None)
        page = runs[:limit]
        return RunPage(page, query.cursor_after(page[-1]))

    async def delete_run(self, run_id: str) -> bool:
        """Remove the run's record, events, snapshots and ledger; False when there was nothing to remove.

        Media blobs stay: they are content-addressed and may be shared with other runs. Not part of
        the reference's contract: a store that does not implement it raises `NotImplementedError`.
        """
        raise _missing(self, 'delete_run', 'to remove runs (delete_conversation and prune use it)')

    async def delete_conversation(self, conversation_id: str, *, include_delegates: bool = False) -> int:
        """Remove every run of the conversation through `delete_run`; answers how many runs were removed.

        With `include_delegates=True`, also every run whose `parent_run_id` chain leads to a run of
        the conversation, whatever conversation it carries. Delegates go before the runs that
        started them and newer runs before older ones, so a delete stopped half way leaves every
        remaining run reachable, and calling it again finishes the job.
        """
        if not isinstance(conversation_id, str) or not conversation_id:
            raise ValueError(f'conversation_id {conversation_id!r} cannot name a conversation: pass a non-empty string')
        order = [r.run_id for r in await self.list_runs(conversation_id=conversation_id)]
        if include_delegates:
            seen = set(order)
            frontier = list(order)
            while frontier:
                children: list[str] = []
                for run_id in frontier:
                    for child in await self.list_runs(parent_run_id=run_id):
                        if child.run_id not in seen:
                            seen.add(child.run_id)
                            children.append(child.run_id)
                order.extend(children)
                frontier = children
        removed = 0
        for run_id in reversed(order):
            if await self.delete_run(run_id):
                removed += 1
        return removed

    async def prune(
        self,
        older_than: timedelta,
        *,
        conversation_id: str | None = None,
        dry_run: bool = False,
        progress: PruneProgress | None = None,
    ) -> PruneReport:
        """Remove the runs whose start and last activity are both older than `older_than` (from now).

        A run's last activity is the newest of its start, its events, its ledger entries'
        `updated_at` and its snapshots' `created_at`: a run that started long ago but was written
        to since the cutoff is still being written, and is kept (listed in `kept_active`).
        `conversation_id` limits pruning to one conversation; `dry_run=True` removes nothing and
        reports what would go. `progress(examined, total)` is called as runs are examined.
        """
        older_than = check_older_than(older_than)
        if conversation_id is not None and (not isinstance(conversation_id, str) or not conversation_id):
            raise ValueError(f'conversation_id {conversation_id!r} is not a filter: pass a non-empty string, or None')
        cutoff = utcnow() - older_than
        candidates = await self.list_runs(conversation_id=conversation_id, started_before=cutoff)
        report = PruneReport(cutoff=cutoff, dry_run=bool(dry_run))
        if progress is not None:
            progress(0, len(candidates))
        for done, run in enumerate(candidates, 1):
            footprint = await self._prune_run(run.run_id, cutoff, dry_run=bool(dry_run))
            if footprint is not None:
                if footprint.last_activity >= cutoff:
                    report.kept_active.append(run.run_id)
                else:
                    report.add(footprint)
            if progress is not None:
                progress(done, len(candidates))
        return report

    async def _prune_run(self, run_id: str, cutoff: datetime, *, dry_run: bool) -> RunFootprint | None:
        """Weigh one run and remove it when it has been idle since before `cutoff` (unless `dry_run`);
        answers its footprint, or `None` when it is gone. A store with transactions does both in one."""
        footprint = await self._run_footprint(run_id)
        if footprint is None or dry_run or footprint.last_activity >= cutoff:
            return footprint
        return footprint if await self.delete_run(run_id) else None

    async def _run_footprint(self, run_id: str) -> RunFootprint | None:
        """How much a run holds and when it was last written (`None`: no such run)."""
        run = await self.get_run(run_id=run_id)
        if run is None:
            return None
        events = await self.list_events(run_id=run_id)
        effects = await self.list_tool_effects(run_id=run_id)
        snapshots = await self.list_snapshots(run_id=run_id, include_interrupted=True)
        times = [
            sort_time(run.started_at),
            *(sort_time(e.timestamp) for e in events),
            *(sort_time(e.updated_at or e.started_at) for e in effects),
            *(sort_time(s.timestamp) for s in snapshots),
        ]
        return RunFootprint(run_id, len(events), len(snapshots), len(effects), max(times), run_status(events))

    async def _status_of(self, run_id: str) -> RunStatus:
        """The run's status, from its newest event (see `stepcore.store.lifecycle.run_status`)."""
        return run_status(await self.list_events_page(run_id, newest=True, limit=1))

    # -- events -------------------------------------------------------------------------------

    @abstractmethod
    async def append_event(self, event: StepEvent) -> None:
        """Append to the run's event trail (suppressed when its idempotency key was applied)."""

    @abstractmethod
    async def list_events(self, run_id: str) -> list[StepEvent]:
        """The run's events in append order."""

    async def list_events_page(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None, newest: bool = False
    ) -> list[StepEvent]:
        """A window of the run's events, in append order: those after `after_seq` (a `seq` you
        have read), at most `limit` of them, the last ones when `newest=True`.

        Page forward by passing the `seq` of the last event of a page as the next `after_seq`;
        `newest=True, limit=1` reads the run's latest event. Stores that can read a window
        without reading the whole trail override this.
        """
        check_event_window(after_seq, limit)
        return event_window(await self.list_events(run_id=run_id), after_seq, limit, newest)

    # -- snapshots ----------------------------------------------------------------------------

    @abstractmethod
    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        """Store a copy of the snapshot (suppressed when its idempotency key was applied)."""

    async def list_snapshots(self, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        """The run's retained `complete` snapshots, or all of them with `include_interrupted=True`,
        oldest `seq` first (write order).

        Implement this or `latest_snapshot` (or both): each is derived from the other as far as it
        can be. A store with `latest_snapshot` alone answers the newest snapshot only; ask it for
        all of them and it raises `NotImplementedError`.
        """
        if _overrides(self, 'latest_snapshot'):
            raise _missing(self, 'list_snapshots', 'to list every snapshot of a run (it has latest_snapshot only)')
        raise _missing(self, 'list_snapshots or latest_snapshot', 'to read snapshots')

    async def latest_snapshot(self, run_id: str, *, include_interrupted: bool = False) -> ContinuableSnapshot | None:
        """The newest complete snapshot, or the newest of any state with `include_interrupted=True`."""
        if not _overrides(self, 'list_snapshots'):
            raise _missing(self, 'list_snapshots or latest_snapshot', 'to read snapshots')
        found = await self.list_snapshots(run_id=run_id, include_interrupted=include_interrupted)
        return found[-1] if found else None

    async def list_snapshot_summaries(self, run_id: str, *, include_interrupted: bool = False) -> list[SnapshotSummary]:
        """`list_snapshots` without the messages: each retained snapshot's seq, state, step and
        message count, oldest first. Stores that keep messages apart override this to read none."""
        return [
            SnapshotSummary.of(s)
            for s in await self.list_snapshots(run_id=run_id, include_interrupted=include_interrupted)
        ]

    async def get_snapshot(self, run_id: str, seq: int) -> ContinuableSnapshot | None:
        """The retained snapshot with this `seq` (complete or interrupted), or `None`."""
        check_seq(seq)
        for snapshot in await self.list_snapshots(run_id=run_id, include_interrupted=True):
            if snapshot.seq == seq:
                return snapshot
        return None

    async def get_snapshot_messages(
        self, run_id: str, seq: int, *, start: int = 0, stop: int | None = None
    ) -> SnapshotMessages | None:
        """Messages `start` to `stop` (positions from 0, oldest first; `stop=None` for the end) of the
        retained snapshot with this `seq`, with its summary; `None` when there is no such snapshot.

        For a long history of which a reader shows a part. Stores that keep messages apart override
        this to decode only the asked ones (the others are still checked where the store keeps
        checksums).
        """
        check_seq(seq)
        check_message_window(start, stop)
        snapshot = await self.get_snapshot(run_id, seq)
        if snapshot is None:
            return None
        count = len(snapshot.messages)
        begin = min(start, count)
        return SnapshotMessages(
            summary=SnapshotSummary.of(snapshot),
            start=begin,
            messages=snapshot.messages[begin : count if stop is None else max(begin, min(stop, count))],
        )

    async def shared_message_count(self, run_id: str, seq: int, other_seq: int) -> int:
        """How many leading messages the retained snapshots `seq` and `other_seq` of the run have in
        common: what a reader comparing two snapshots can skip. `LookupError` naming a seq the run
        has no snapshot with.

        A store that keeps each message once, referenced by every snapshot holding it, answers from
        those references without decoding any message; such a store may count fewer than the equal
        leading messages when equal messages were stored twice (a history rewritten and then written
        again the same). This default compares the messages.
        """
        check_seq(seq)
        check_seq(other_seq)
        found: list[ContinuableSnapshot] = []
        for wanted in (seq, other_seq):
            snapshot = await self.get_snapshot(run_id, wanted)
            if snapshot is None:
                raise LookupError(f'run {run_id!r} has no retained snapshot with seq {wanted}')
            found.append(snapshot)
        return shared_prefix(found[0].messages, found[1].messages)

    # -- tool effects -------------------------------------------------------------------------

    @abstractmethod
    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        """Insert or replace the ledger entry for `(record.run_id, record.tool_call_id)`."""

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        """Every ledger entry of the run, oldest `started_at` first.

        Implement this, or `get_tool_effect` and `list_unresolved_tool_effects` (the reference's
        contract), which this one derives from where it can. Without it a store can tell its
        unresolved entries but not list all of them: it raises `NotImplementedError`.
        """
        raise _missing(self, 'list_tool_effects', 'to list every ledger entry of a run')

    async def get_tool_effect(self, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        """One ledger entry, or `None`."""
        if not _overrides(self, 'list_tool_effects'):
            raise _missing(self, 'get_tool_effect or list_tool_effects', 'to read the ledger')
        for record in await self.list_tool_effects(run_id=run_id):
            if record.tool_call_id == tool_call_id:
                return record
        return None

    async def list_unresolved_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        """Entries still `started`: the call may or may not have happened."""
        if not _overrides(self, 'list_tool_effects'):
            raise _missing(self, 'list_unresolved_tool_effects or list_tool_effects', 'to read the ledger')
        return [r for r in await self.list_tool_effects(run_id=run_id) if r.status is ToolEffectStatus.STARTED]

    # -- several writes at once ---------------------------------------------------------------

    async def write_batch(self, writes: Sequence[StepWrite], *, snapshot: ContinuableSnapshot | None = None) -> None:
        """Save `snapshot` (if given), then apply `writes` in order, as the single-record methods would.

        Events keep their order and idempotency-key suppression (a key repeated within the batch is
        applied once); ledger entries upsert, so a later entry for the same call wins. The snapshot
        goes first so that a `completed` ledger entry is never durable before the snapshot holding
        the call's result. Stores with transactions apply the batch atomically. A write of another
        type raises `TypeError` before anything is written.

        This default makes one call per record; stores override it to write the batch at once.
        """
        check_writes(writes)
        if snapshot is not None:
            await self.save_snapshot(snapshot)
        for write in writes:
            if isinstance(write, StepEvent):
                await self.append_event(write)
            else:
                await self.record_tool_effect(write)

    # -- whole-store maintenance ------------------------------------------------------------

    async def check_integrity(self) -> list[str] | None:
        """What the backend's own integrity check finds wrong in the whole store, one line per
        problem (empty: nothing); `None`, the default, when the backend has no such check."""
        return None

    async def counts_records(self, run_id: str) -> bool | None:
        """Whether the store keeps a count of the run's records, so that a read tells records missing
        at the end of a listing (a damaged index) from the end of the run; `None`, the default, when
        the store cannot say."""
        return None

    async def stored_run_ids(self) -> list[str]:
        """The id of every run the store holds, sorted: what garbage collection and rekey visit.

        Derived from `list_runs`. A store that can hold data of a run `list_runs` does not show (a
        damaged run record, a snapshot saved without `register_run`) overrides it so that
        maintenance does not overlook what it cannot read.
        """
        return sorted({run.run_id for run in await self.list_runs()})

    async def media_references(self, run_id: str) -> set[str]:
        """The `media+sha256://` URIs the run's snapshots (complete and interrupted) may reference.

        Derived from `list_snapshots`: the address of every payload the snapshots hold, whatever its
        size, since the store's threshold is not known here (counting more is safe: garbage
        collection keeps what is counted). A store that knows what it externalized overrides it.
        """
        snapshots = await self.list_snapshots(run_id, include_interrupted=True)
        return await payload_addresses(encode_message(m) for s in snapshots for m in s.messages)

    async def stored_key_ids(self, run_id: str) -> set[str | None]:
        """The encryption key ids the run's stored bodies were written with (`None`: in clear).

        A store without the feature `encryption` keeps everything in clear: `{None}` for a run it
        holds, an empty set for one it does not. `stepcore rekey` uses it to find the runs to rewrite.
        """
        if await self.get_run(run_id) is not None:
            return {None}
        return {None} if await self.latest_snapshot(run_id, include_interrupted=True) is not None else set()

    # -- the store itself ---------------------------------------------------------------------

    def is_transient(self, error: BaseException) -> bool:
        """Whether `error`, raised by this store, is a passing failure (a timeout, a lost connection,
        a lock another session holds, a conflict): the same call a little later may succeed (see
        `stepcore.engine.EngineStore.is_transient`). The default, for a store that cannot tell: never."""
        return False

    async def store_identity(self) -> str | None:
        """The id the store keeps with its data, the same for every store object on that data (see
        `stepcore.engine.EngineStore.store_identity`); `None`, the default, when it keeps none."""
        return None

    async def store_location(self) -> str | None:
        """Where the store's data lives, naming it for a person without a password (see
        `stepcore.engine.EngineStore.store_location`); `None`, the default, when the store cannot say."""
        return None

    # -- run ownership: the feature `leases` (see `stepcore.store.leases`) ---------------------

    async def get_lease(self, run_id: str) -> Lease | None:
        """The run's lease, read with the store's clock; `None` when it has none."""
        raise _missing(self, 'get_lease', "to keep run ownership (declare the feature 'leases')")

    async def swap_lease(
        self,
        lease: Lease,
        *,
        expect: int | None,
        expired: bool = False,
        ttl: float,
        start: Sequence[ModelMessage] | None = None,
    ) -> tuple[bool, Lease | None]:
        """Compare and set the run's lease, atomically on the store (see `stepcore.engine.ops.SwapLease`)."""
        raise _missing(self, 'swap_lease', "to keep run ownership (declare the feature 'leases')")

    async def list_leases(self, states: Sequence[LeaseState | str]) -> list[Lease]:
        """The leases in one of `states` (never `ended`), through an index on the state."""
        raise _missing(self, 'list_leases', "to find orphaned runs (declare the feature 'leases')")

    async def lease_start(self, run_id: str) -> list[ModelMessage] | None:
        """The history stored with the run's lease for a restart, or `None`."""
        raise _missing(self, 'lease_start', "to restart a run killed before its first snapshot (feature 'leases')")

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release connections or clients the store opened itself."""
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    @classmethod
    def __subclasshook__(cls, other: type) -> bool:
        """A class with every method of the reference's contract counts as a `StepStore`, as an
        object of it passes `isinstance` against the reference's runtime-checkable protocol."""
        if cls is StepStore and all(_defines(other, name) for name in CONTRACT_METHODS):
            return True
        return NotImplemented

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        features: object = cls.__dict__.get('features', cls.features)
        if not isinstance(features, frozenset):
            raise TypeError(f'{cls.__name__}.features must be a frozenset of feature names, got {features!r}')
        if not cls.implied_features <= features:
            cls.features = cast(frozenset[str], features) | cls.implied_features
        own_runs: object = cls.__dict__.get('list_runs')
        if callable(own_runs) and not takes_keywords(own_runs, 'limit', 'cursor'):
            cls.list_runs = paged(cls.__name__, own_runs)  # pyright: ignore[reportAttributeAccessIssue]
