"""`stepcore gc`: garbage collection of media from the command line (see `stepcore.maintenance.gc`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rich.console import Console
from rich.table import Table

from stepcore.cli.console import progress
from stepcore.cli.fitting import fit
from stepcore.cli.stores import StoreError, open_store
from stepcore.maintenance.gc import GcReport, collect_garbage
from stepcore.media.protocol import MediaStore
from stepcore.plugins import registry
from stepcore.store import lifecycle

__all__ = ('gc_report_json', 'open_media_store', 'parse_duration', 'print_gc_report', 'run_gc')


def parse_duration(text: str) -> timedelta:
    """A `--grace` value: `30s`, `15m`, `1h`, `2d`, `1w`, `1h30m` or `0`; `ValueError` saying what to use."""
    return lifecycle.parse_duration(text, allow_zero=True, option='--grace')


def open_media_store(url: str) -> MediaStore:
    """The media store a `KEY://?option=value` URL names (e.g. `disk://?directory=/srv/media`)."""
    try:
        backend, options = registry.get_registry().for_url('media', url)
        media: MediaStore = backend.create(**backend.merge_options(options, {}))
    except (ValueError, TypeError) as exc:
        raise StoreError(f'--media {url!r}: {exc}') from None
    return media


async def run_gc(store_url: str, media_url: str | None, *, grace: timedelta, dry_run: bool) -> GcReport:
    """Open the stores, collect with a progress bar on stderr, close them, return the report."""
    store = open_store(store_url)
    media = None
    try:
        media = open_media_store(media_url) if media_url else None
        with progress('reading snapshots') as bar:
            sweeping = False

            def report(phase: str, done: int, total: int | None) -> None:
                nonlocal sweeping
                if phase == 'sweep' and not sweeping:
                    sweeping = True
                    bar.next('sweeping blobs')
                bar.update(done, total)

            return await collect_garbage(store, media, grace=grace, dry_run=dry_run, progress=report)
    finally:
        await store.aclose()
        closer: Any = getattr(media, 'aclose', None)
        if closer is not None:
            await closer()


def _size(n: int) -> str:
    value = float(n)
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if value < 1024 or unit == 'GiB':
            return f'{n} B' if unit == 'B' else f'{value:.1f} {unit}'
        value /= 1024
    return f'{n} B'  # pragma: no cover


def print_gc_report(report: GcReport, console: Console) -> None:
    """The summary table of a collection."""
    removed = 'would remove' if report.dry_run else 'removed'
    table = Table(title='media garbage collection' + (' (dry run: nothing removed)' if report.dry_run else ''))
    table.add_column('', style='bold')
    table.add_column('blobs', justify='right')
    table.add_column('bytes', justify='right')
    table.add_row('kept: referenced by a snapshot', str(report.kept_referenced), '')
    table.add_row('kept: put within the grace period', str(report.kept_young), '')
    table.add_row(removed, str(report.removed), _size(report.bytes_freed))
    console.print(fit(table, console.width))
    cutoff = report.cutoff.isoformat(timespec='seconds')
    console.print(
        f'{report.runs} run(s) read, {report.referenced} blob(s) referenced; unreferenced blobs last put before '
        f'{cutoff} are collected.',
        highlight=False,
    )
    if report.missing:
        console.print(
            f'[yellow]warning:[/] {report.missing} referenced blob(s) are missing from the media store: the '
            'snapshots holding them cannot be read back whole',
            highlight=False,
        )


def gc_report_json(report: GcReport) -> dict[str, Any]:
    """The report as JSON-compatible data (for `--json`)."""
    return {
        'dry_run': report.dry_run,
        'cutoff': report.cutoff.isoformat(),
        'runs': report.runs,
        'referenced': report.referenced,
        'kept': report.kept,
        'kept_referenced': report.kept_referenced,
        'kept_young': report.kept_young,
        'removed': report.removed,
        'bytes_freed': report.bytes_freed,
        'missing': report.missing,
        'removed_uris': report.removed_uris,
    }
