"""Copying the runs of a pydantic-ai-harness store into any stepcore store.

Each run is written whole, with its run record last: snapshots (each saved as the harness saved
it, so the target stores only what is new at each one and externalizes media under its own rules),
then its events and ledger entries in one batch, then the record. So a run whose record the target
holds was imported completely, and importing again leaves it alone; what an interrupted import
left of a run without its record is deleted and written again. A run id the target holds for a
different run is reported and left alone, on both sides.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from stepcore.harness.file_source import HarnessFileSource, is_harness_folder
from stepcore.harness.source import HarnessRun, HarnessSource
from stepcore.harness.sqlite_source import open_harness_sqlite
from stepcore.store.lifecycle import sort_time
from stepcore.store.models import RunRecord
from stepcore.store.step_store import StepStore

__all__ = ('HarnessImportSummary', 'import_harness', 'open_harness_source')

SQLITE_HEADER = b'SQLite format 3\x00'
_SAME_START = timedelta(milliseconds=1)
"""Stores that keep timestamps to the millisecond (MongoDB) still recognise an imported run."""


@dataclass(kw_only=True)
class HarnessImportSummary:
    """What an import did."""

    source: str
    imported: list[str] = field(default_factory=list[str])
    """Runs written by this import."""
    already_imported: list[str] = field(default_factory=list[str])
    """Runs the target already held, left as they are."""
    conflicts: list[str] = field(default_factory=list[str])
    """Why each run whose id the target holds for another run was left out."""
    skipped: list[str] = field(default_factory=list[str])
    """Each record of the source that could not be read, and so was not imported."""
    events: int = 0
    snapshots: int = 0
    tool_effects: int = 0
    media: set[str] = field(default_factory=set[str])
    """Digests of the externalized payloads the imported snapshots carried."""

    @property
    def complete(self) -> bool:
        """True when nothing of the source was left out."""
        return not self.conflicts and not self.skipped


def open_harness_source(path: str | os.PathLike[str]) -> HarnessSource:
    """A harness store at `path`: a SQLite database file, or the root folder of a file store.

    Raises `ValueError` for anything else. Close it (or use it as a context manager) when done.
    """
    location = Path(path)
    if location.is_dir():
        if not is_harness_folder(location):
            HarnessFileSource(location)  # names a stepcore store for what it is
            raise ValueError(
                f'{str(location)!r} holds no pydantic-ai-harness runs: point at the folder given to its '
                'FileStepStore (the one holding a folder per run), or at its SQLite database file'
            )
        return HarnessFileSource(location)
    try:
        with location.open('rb') as f:
            header = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        raise ValueError(
            f'{str(location)!r} does not exist: give a harness SQLite database or file-store folder'
        ) from None
    if header != SQLITE_HEADER:
        raise ValueError(
            f'{str(location)!r} is neither a SQLite database nor a folder: give a harness SQLite database or '
            'file-store folder'
        )
    return open_harness_sqlite(location)


def _same_run(stored: RunRecord, record: RunRecord) -> bool:
    same_lineage = (stored.agent_name, stored.conversation_id, stored.parent_run_id, stored.registration_id) == (
        record.agent_name,
        record.conversation_id,
        record.parent_run_id,
        record.registration_id,
    )
    return same_lineage and abs(sort_time(stored.started_at) - sort_time(record.started_at)) < _SAME_START


async def _import_run(run: HarnessRun, store: StepStore, summary: HarnessImportSummary) -> None:
    summary.skipped += run.skipped
    if run.record is None and not (run.events or run.snapshots or run.tool_effects):
        return  # nothing of it could be read
    stored = await store.get_run(run_id=run.run_id)
    if stored is not None:
        if run.record is not None and _same_run(stored, run.record):
            summary.already_imported.append(run.run_id)
        else:
            summary.conflicts.append(
                f'run {run.run_id!r} is already in the target store as another run '
                f'(started {stored.started_at.isoformat()}, agent {stored.agent_name!r}): left out'
            )
        return
    await store.delete_run(run.run_id)  # what an interrupted import of this run left behind
    for snapshot in run.snapshots:
        await store.save_snapshot(snapshot)
    await store.write_batch([*run.events, *run.tool_effects])
    if run.record is not None:
        await store.register_run(run.record)
    summary.imported.append(run.run_id)
    summary.events += len(run.events)
    summary.snapshots += len(run.snapshots)
    summary.tool_effects += len(run.tool_effects)
    summary.media |= run.media


async def import_harness(
    source: HarnessSource | str | os.PathLike[str],
    store: StepStore,
    *,
    run_ids: Sequence[str] | None = None,
    progress: Callable[[HarnessRun], None] | None = None,
) -> HarnessImportSummary:
    """Copy the runs of a pydantic-ai-harness store into `store`; importing again adds nothing.

    `source` is an open `HarnessSource` or a path (`open_harness_source`). `run_ids` limits the
    import to those runs (default: all of them, `source.run_ids()`); `progress` is called after
    each run. Records that cannot be read are left out with a warning on the `stepcore.harness`
    logger and listed in the summary, as is each run the target holds under the same id for
    another run.
    """
    if not isinstance(source, HarnessSource):
        with open_harness_source(source) as opened:
            return await import_harness(opened, store, run_ids=run_ids, progress=progress)
    summary = HarnessImportSummary(source=source.describe())
    for run_id in source.run_ids() if run_ids is None else run_ids:
        run = source.read_run(run_id)
        await _import_run(run, store, summary)
        if progress is not None:
            progress(run)
    return summary
