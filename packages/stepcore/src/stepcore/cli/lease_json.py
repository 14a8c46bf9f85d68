"""A run's lease as the command line shows it: as JSON, and in the table of a job's runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from stepcore.cli.cells import dash, styled_status, titled_table
from stepcore.cli.fitting import fit
from stepcore.cli.words import owner_text
from stepcore.recovery.jobs import JobRun
from stepcore.store.leases import Lease, LeaseState

__all__ = ('job_table', 'lease_json')


def lease_json(lease: Lease) -> dict[str, Any]:
    """A lease for `--json` output (fields with nothing to say are left out where they are new)."""
    data: dict[str, Any] = {
        'epoch': lease.epoch,
        'state': lease.state.value,
        'owner': lease.owner.to_json() if lease.owner is not None else None,
        'expires_at': lease.expires_at.isoformat(),
        'checked_at': lease.checked_at.isoformat(),
        'resumes': lease.resumes,
        'resumed_by': lease.resumed_by,
        'outcome': lease.outcome,
        'note': lease.note,
    }
    if lease.version is not None:
        data['version'] = lease.version
    if lease.job is not None:
        data['job'] = lease.job
    if lease.died:
        data['died'] = [attempt.to_json() for attempt in lease.died]
    return data


def job_table(runs: Sequence[JobRun], *, width: int | None = None) -> Table:
    """The runs of a job, oldest first: how each stands and who held it (cells wrap to fit `width`)."""
    table = titled_table(None)
    table.add_column('run_id', overflow='fold')
    table.add_column('status', no_wrap=True)
    table.add_column('lease', overflow='fold')
    table.add_column('epoch', justify='right', no_wrap=True)
    table.add_column('owner / note', overflow='fold')
    for run in runs:
        lease = run.lease
        if lease is None:
            table.add_row(Text(run.run_id), styled_status(run.status), dash(None), dash(None), dash(None))
            continue
        state = lease.state.value + (f' ({lease.outcome})' if lease.outcome and lease.state is LeaseState.ENDED else '')
        table.add_row(
            Text(run.run_id), styled_status(run.status), Text(state), Text(str(lease.epoch)), dash(_holder(lease))
        )
    return table if width is None else fit(table, width)


def _holder(lease: Lease) -> str | None:
    """Who holds a lease (`vm pid 7`, `vm pid 7, recovering it`), else what was noted on it."""
    owner = lease.owner
    if owner is None:
        return lease.note
    return owner_text(owner) + (', recovering it' if owner.role == 'recovery' else '')
