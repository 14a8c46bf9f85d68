"""Garbage collection of media: remove the blobs no stored snapshot references any more.

Mark, then sweep:

1. **mark**: every `media+sha256://` URI referenced by a kept snapshot (complete or interrupted)
   of any run of the step store(s), as each store's `stored_run_ids` and `media_references`
   answer. A store built on the engine answers from its stored messages without fetching a blob,
   and stops on a snapshot it cannot read (`DamagedRecordError`) rather than let that snapshot's
   media go; the `StepStore` defaults read the public API (`list_runs`,
   `list_snapshots(include_interrupted=True)`) and count every payload.
2. **sweep**: every blob the media store lists that is not marked and was last put before
   `now - grace` is removed, each with `delete_media(uri, older_than=now - grace)`, so a blob put
   again while the collection runs stays.

Why this is safe against a writer running at the same time: a snapshot's blobs are put before the
snapshot is saved, and a `put` of bytes already stored moves the blob's time to now. So a blob
that a snapshot not yet saved will reference was put within the last moments, which is inside the
grace period, and a snapshot saved before the mark read its run is marked. The one assumption is
that a writer saves a snapshot less than `grace` after putting its blobs (seconds, against an
hour by default).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

from stepcore.common.features import MEDIA_COLLECTION, require_feature
from stepcore.media.protocol import CollectableMediaStore, MediaStore, StoredMedia
from stepcore.store.contract import as_step_store
from stepcore.store.models import utcnow
from stepcore.store.step_store import StepStore

__all__ = ('DEFAULT_GRACE', 'GcProgress', 'GcReport', 'collect_garbage')

DEFAULT_GRACE = timedelta(hours=1)
"""How long a blob is kept after its last put even when nothing references it."""

_DELETES_IN_FLIGHT = 8

GcProgress = Callable[[str, int, int | None], None]
"""`progress(phase, done, total)`: phase `'mark'` counts runs read (of `total`), phase `'sweep'`
counts blobs looked at (`total` is `None`: a listing's length is not known in advance)."""


@dataclass(kw_only=True)
class GcReport:
    """What a collection found and did."""

    dry_run: bool
    """Whether nothing was removed (the counts say what would have been)."""
    cutoff: datetime
    """Blobs last put before this time and referenced by no snapshot are removed."""
    runs: int = 0
    """Runs whose snapshots were read."""
    referenced: int = 0
    """Distinct blobs referenced by those snapshots."""
    kept_referenced: int = 0
    """Stored blobs kept because a snapshot references them."""
    kept_young: int = 0
    """Stored blobs referenced by nothing but put within the grace period (or put again meanwhile)."""
    removed: int = 0
    """Blobs removed (with `dry_run`: that would be removed)."""
    bytes_freed: int = 0
    """Their total size in bytes."""
    missing: int = 0
    """Referenced blobs the media store does not hold (their snapshots cannot be read back whole)."""
    removed_uris: list[str] = field(default_factory=list[str])
    """The URIs of the removed blobs."""

    @property
    def kept(self) -> int:
        """Stored blobs kept, for either reason."""
        return self.kept_referenced + self.kept_young


async def collect_garbage(
    step_store: StepStore | Sequence[StepStore],
    media_store: MediaStore | None = None,
    *,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    progress: GcProgress | None = None,
    now: datetime | None = None,
) -> GcReport:
    """Remove the media no snapshot references that were last put more than `grace` ago.

    `step_store` is the store whose snapshots reference the media, or a sequence of every store
    sharing one media store: a blob referenced only by a store left out would be removed.
    `media_store` defaults to the step store's own (its `media_store` attribute) and must declare
    the feature `media_collection`. With `dry_run`, nothing is removed and the report says what
    would be. `now` is the time the grace period counts back from (default: the current time).
    """
    stores: list[StepStore] = [step_store] if isinstance(step_store, StepStore) else list(step_store)
    if not stores:
        raise ValueError(
            'collect_garbage got no step store: pass the store (or every store) whose snapshots use the media'
        )
    media = _media_of(stores, media_store)
    if not isinstance(cast(object, grace), timedelta) or grace < timedelta(0):
        raise ValueError(f'grace={grace!r} must be a timedelta of zero or more, e.g. timedelta(hours=1)')
    start = utcnow() if now is None else now
    if start.tzinfo is None:
        raise ValueError(f'now={now!r} must be an aware datetime (e.g. datetime.now(UTC))')
    report = GcReport(dry_run=dry_run, cutoff=start - grace)
    marked = await _mark([as_step_store(s) for s in stores], report, progress)
    await _sweep(media, marked, report, progress)
    return report


def _media_of(stores: Sequence[StepStore], media_store: MediaStore | None) -> CollectableMediaStore:
    media: object = media_store
    if media is None:
        found = {id(m): m for s in stores if (m := getattr(s, 'media_store', None)) is not None}
        if len(found) != 1:
            names = ', '.join(type(s).__name__ for s in stores)
            raise ValueError(
                f'cannot tell which media store to collect for {names}: '
                + ('it keeps no media store' if not found else 'they keep different media stores')
                + ', so pass media_store='
            )
        media = next(iter(found.values()))
    require_feature(media, MEDIA_COLLECTION, option='garbage collection')
    return cast(CollectableMediaStore, media)


async def _mark(stores: Sequence[StepStore], report: GcReport, progress: GcProgress | None) -> set[str]:
    marked: set[str] = set()
    plan: list[tuple[StepStore, list[str]]] = []
    for store in stores:
        plan.append((store, await store.stored_run_ids()))
    total = sum(len(ids) for _, ids in plan)
    done = 0
    if progress is not None:
        progress('mark', 0, total)
    for store, ids in plan:
        for run_id in ids:
            marked |= await store.media_references(run_id)
            done += 1
            if progress is not None:
                progress('mark', done, total)
    report.runs = total
    report.referenced = len(marked)
    return marked


async def _sweep(media: CollectableMediaStore, marked: set[str], report: GcReport, progress: GcProgress | None) -> None:
    listed: set[str] = set()
    slots = asyncio.Semaphore(_DELETES_IN_FLIGHT)
    pending: set[asyncio.Task[None]] = set()

    def count_removed(blob: StoredMedia) -> None:
        report.removed += 1
        report.bytes_freed += blob.size
        report.removed_uris.append(blob.uri)

    async def remove(blob: StoredMedia) -> None:
        try:
            removed = await media.delete_media(blob.uri, older_than=report.cutoff)
        finally:
            slots.release()
        if removed:
            count_removed(blob)
        else:
            report.kept_young += 1  # put again since it was listed, or removed by someone else

    seen = 0
    try:
        async for blob in media.list_media():
            seen += 1
            listed.add(blob.uri)
            if blob.uri in marked:
                report.kept_referenced += 1
            elif blob.stored_at >= report.cutoff:
                report.kept_young += 1
            elif report.dry_run:
                count_removed(blob)
            else:
                await slots.acquire()  # a few deletes in flight at once, however long the listing
                task = asyncio.ensure_future(remove(blob))
                pending.add(task)
                task.add_done_callback(pending.discard)
            if progress is not None:
                progress('sweep', seen, None)
        if pending:
            await asyncio.gather(*pending)
    finally:
        for task in pending:
            task.cancel()
    report.removed_uris.sort()
    report.missing = len(marked - listed)
