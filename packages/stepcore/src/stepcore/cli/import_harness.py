"""`stepcore import --from-harness PATH`: copy the runs of a pydantic-ai-harness store into a stepcore store.

PATH is the harness's SQLite database file or the root folder of its file store; the target is any
store URL (created if needed). A progress bar shows on a terminal; a summary follows. Importing
again adds nothing (see `stepcore.harness.importer`). The exit status is 1 when anything of the
source was left out: a damaged record, or a run id the target holds for another run.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stepcore.cli.console import progress
from stepcore.cli.fitting import fit
from stepcore.cli.stores import StoreError, open_store, parse_store_url, resolve_store_url
from stepcore.harness import HarnessImportSummary, import_harness, open_harness_source

__all__ = ('import_from_harness', 'summary_table')


def _same_place(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def summary_table(summary: HarnessImportSummary) -> Table:
    """The counts of an import, one row each."""
    table = Table(show_header=False)
    table.add_column('what')
    table.add_column('count', justify='right')
    rows = (
        ('runs imported', len(summary.imported)),
        ('runs already imported (left as they are)', len(summary.already_imported)),
        ('runs left out: another run has their id in the target', len(summary.conflicts)),
        ('events', summary.events),
        ('snapshots', summary.snapshots),
        ('ledger entries', summary.tool_effects),
        ('media payloads', len(summary.media)),
        ('records left out: cannot be read', len(summary.skipped)),
    )
    for what, count in rows:
        table.add_row(what, str(count), style='red' if count and what.endswith(('target', 'read')) else None)
    return table


async def import_from_harness(path: Path, store_url: str | None) -> None:
    """Import every run of the harness store at `path` into the store `store_url` names, and report."""
    url = resolve_store_url(store_url)
    target = parse_store_url(url)
    if target.local_path is not None and _same_place(target.local_path, path):
        in_place = (
            f'; a harness SQLite database is also migrated in place by opening it with stepcore '
            f'(e.g. stepcore runs -s sqlite:///{path}), after a backup is written beside it'
            if path.is_file()
            else ''
        )
        raise StoreError(f'--store names {str(path)!r} itself: give another store to copy its runs into{in_place}')
    with open_harness_source(path) as source:
        run_ids = source.run_ids()
        store = open_store(url, must_exist=False)
        try:
            with progress('importing runs', len(run_ids)) as bar:
                summary = await import_harness(
                    source,
                    store,
                    run_ids=run_ids,
                    progress=lambda run: bar.advance(description=f'imported {run.run_id}'),
                )
        finally:
            await store.aclose()
    out = Console()
    out.print(Text(f'from {summary.source} into {target.describe()}:'), soft_wrap=True)
    out.print(fit(summary_table(summary), out.width))
    for line in [*summary.conflicts, *summary.skipped]:
        out.print(Text.assemble(('left out:', 'red'), f' {line}'), soft_wrap=True)
    if not summary.complete:
        raise typer.Exit(1)
