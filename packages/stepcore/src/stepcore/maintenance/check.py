"""Checking a whole store: the backend's own integrity check, then every record of every run read back.

`check_store(store)` runs the backend's integrity check where it has one (SQLite's
`PRAGMA integrity_check`), then reads every run the store holds (`stored_run_ids`, which includes
runs whose record cannot be read) through the public API: its record, events, ledger and every
snapshot with its messages, interrupted ones included. Every checksum is verified on the way, as
every read does, and every listing against the count of records kept with the run's lease (a run
without one is listed in `uncounted`: records missing at its end cannot be told). A record that
does not read is reported under its run — whether the read raised `DamagedRecordError` or a
listing left it out with a warning, stepcore's or the backend's own logger's — and the check goes
on with the next read. Nothing is written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from stepcore.common.damage import DamagedRecordError, warnings_logged
from stepcore.store.contract import as_step_store
from stepcore.store.protocols import StepStoreProtocol

__all__ = ('StoreCheck', 'check_store')


@dataclass
class StoreCheck:
    """What `check_store` found."""

    runs: int = 0
    """How many runs were read."""
    integrity: list[str] | None = None
    """What the backend's own check found wrong (empty: nothing); `None` when it has no such check."""
    damaged: dict[str, list[str]] = field(default_factory=dict[str, list[str]])
    """Run id -> what could not be read of it, one line each."""
    errors: list[str] = field(default_factory=list[str])
    """Failures that are about the store rather than one run (the run list could not be read)."""
    uncounted: list[str] = field(default_factory=list[str])
    """Runs of which the store keeps no count of records (written without a lease, or by an older
    release): records missing at the end of one of their listings cannot be told. Not damage."""

    @property
    def ok(self) -> bool:
        """Whether nothing was found wrong."""
        return not (self.integrity or self.damaged or self.errors)


async def check_store(store: StepStoreProtocol, *, progress: Callable[[int, int], None] | None = None) -> StoreCheck:
    """Check every record of `store` (see the module docstring); `progress(done, total)` after each run."""
    target = as_step_store(store)
    report = StoreCheck()
    try:
        report.integrity = await target.check_integrity()
    except Exception as error:  # a file too damaged to check: say so and read what can be read
        report.integrity = [f'{type(error).__name__}: {error}']
    try:
        run_ids = await target.stored_run_ids()
    except Exception as error:
        report.errors.append(f'the run list could not be read: {type(error).__name__}: {error}')
        return report
    reads: tuple[tuple[str, Callable[[str], Awaitable[Any]]], ...] = (
        ('run record', target.get_run),
        ('events', target.list_events),
        ('ledger', target.list_tool_effects),
        ('snapshots', lambda run_id: target.list_snapshots(run_id, include_interrupted=True)),
    )
    for done, run_id in enumerate(run_ids, 1):
        problems: list[str] = []
        for what, read in reads:
            with warnings_logged() as warned:
                try:
                    await read(run_id)
                except DamagedRecordError as error:
                    problems.append(f'{what}: {error}')
                except Exception as error:
                    problems.append(f'{what}: {type(error).__name__}: {error}')
            problems += [f'{what}: {record.getMessage()}' for record in warned]
        if problems:
            report.damaged[run_id] = problems
        with warnings_logged():
            try:
                counted = await target.counts_records(run_id)
            except Exception:  # reported with the run's other reads when it matters
                counted = None
        if counted is False:
            report.uncounted.append(run_id)
        report.runs = done
        if progress is not None:
            progress(done, len(run_ids))
    return report
