"""Whole-store work: `prune`, `export`, `import`, `gc` and `rekey`."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from stepcore.cli.cells import when
from stepcore.cli.console import (
    JsonOption,
    RunArgument,
    StoreOption,
    echo_json,
    err,
    error_text,
    fail,
    out,
    progress,
    run,
    with_run,
    with_store,
)
from stepcore.cli.fitting import fit
from stepcore.cli.stores import open_store, resolve_store_url
from stepcore.cli.transfer import (
    RunExport,
    descendant_ids,
    dump_export,
    export_runs,
    import_runs,
    parse_export,
)
from stepcore.store.lifecycle import PruneReport, parse_duration
from stepcore.store.step_store import StepStore

__all__ = ('export_command', 'gc', 'import_command', 'prune', 'rekey')


def prune(
    older_than: Annotated[
        str,
        typer.Option(
            '--older-than',
            metavar='AGE',
            help='Remove runs whose last activity is older than this: 30d, 12h, 90m, 2w (or 1d12h).',
            show_default=False,
        ),
    ],
    conversation: Annotated[str | None, typer.Option(help='Only runs of this conversation_id.')] = None,
    dry_run: Annotated[bool, typer.Option('--dry-run', help='Remove nothing; report what would go.')] = False,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove runs idle for longer than --older-than, with their events, snapshots and ledger.

    A run still being written is never removed: age counts from a run's last write, not its start.
    """
    try:
        age = parse_duration(older_than, option='--older-than')
    except ValueError as exc:
        fail(str(exc))

    async def body(s: StepStore) -> PruneReport:
        with progress('checking runs' if dry_run else 'pruning runs') as bar:
            return await s.prune(age, conversation_id=conversation, dry_run=dry_run, progress=bar.update)

    report = with_store(store, body)
    if as_json:
        echo_json(
            {
                'dry_run': report.dry_run,
                'cutoff': report.cutoff.isoformat(),
                'runs': report.runs,
                'snapshots': report.snapshots,
                'events': report.events,
                'ledger_entries': report.ledger_entries,
                'kept_active': report.kept_active,
            }
        )
        return
    verb = 'would remove' if report.dry_run else 'removed'
    console = out()
    console.print(f'runs idle since before {when(report.cutoff)} UTC (their last write)')
    table = Table()
    table.add_column(verb)
    table.add_column('count', justify='right')
    for what, count in (
        ('runs', len(report.runs)),
        ('snapshots', report.snapshots),
        ('events', report.events),
        ('ledger entries', report.ledger_entries),
    ):
        table.add_row(what, str(count))
    console.print(fit(table, console.width))
    if report.kept_active:
        console.print(
            f'kept {len(report.kept_active)} run(s) that started before the cutoff but were written to since',
            style='dim',
        )
    if report.dry_run and report.runs:
        console.print('dry run: nothing was removed; run again without --dry-run to remove them', style='dim')


class ExportFormat(str, Enum):
    json = 'json'


def export_command(
    run_id: RunArgument,
    store: StoreOption = None,
    format: Annotated[ExportFormat, typer.Option('--format', help='Output format.')] = ExportFormat.json,
    output: Annotated[Path | None, typer.Option('--output', '-o', help='Write here instead of stdout.')] = None,
    with_delegates: Annotated[
        bool, typer.Option('--with-delegates', help='Also export every run delegated from it, recursively.')
    ] = False,
) -> None:
    """Export a run (record, events, every snapshot with its messages, tool effects) as JSON."""
    del format  # JSON is the only format

    async def body(s: StepStore, rid: str) -> list[RunExport]:
        ids = await descendant_ids(s, rid) if with_delegates else [rid]
        with progress('exporting') as bar:
            return await export_runs(s, ids, progress=bar.advance)

    _, exported = with_run(store, run_id, body)
    text = json.dumps(dump_export(exported), indent=1, ensure_ascii=False)
    if output is None:
        typer.echo(text)
        return
    try:
        output.write_text(text + '\n', encoding='utf-8')
    except OSError as exc:
        fail(f'cannot write {str(output)!r}: {exc.strerror or exc}')
    err().print(Text(f'exported {len(exported)} run(s) to {output}'))


def import_command(
    file: Annotated[
        Path | None, typer.Argument(help='A file written by `stepcore export` ("-" for stdin).', show_default=False)
    ] = None,
    store: StoreOption = None,
    from_harness: Annotated[
        Path | None,
        typer.Option(
            '--from-harness',
            help='Import every run of a pydantic-ai-harness store instead: its SQLite file or file-store folder.',
            show_default=False,
        ),
    ] = None,
) -> None:
    """Import runs from an export file, or from a pydantic-ai-harness store, into a store (created if needed)."""
    if (file is None) == (from_harness is None):
        fail('give one thing to import: an export file, or --from-harness PATH')
    if from_harness is not None:
        from stepcore.cli.import_harness import import_from_harness

        run(import_from_harness(from_harness, store))
        return
    assert file is not None
    try:
        text = sys.stdin.read() if str(file) == '-' else file.read_text(encoding='utf-8')
    except OSError as exc:
        fail(f'cannot read {str(file)!r}: {exc.strerror or exc}')
    try:
        runs_in = parse_export(json.loads(text))
    except ValueError as exc:
        fail(f'{file}: {error_text(exc)}')

    async def body(s: StepStore) -> None:
        with progress('importing', sum(r.size for r in runs_in)) as bar:
            await import_runs(s, runs_in, progress=bar.advance)

    with_store(store, body, must_exist=False)
    names = ', '.join(r.run.run_id for r in runs_in)
    err().print(Text(f'imported {len(runs_in)} run(s): {names}'))


def gc(
    store: StoreOption = None,
    media: Annotated[
        str | None,
        typer.Option(
            metavar='URL',
            help=(
                'The media store to collect, as KEY://?option=value (e.g. disk://?directory=DIR); default: the '
                "store's own. Every store whose snapshots use it must be collected together: pass the one that does."
            ),
            show_default=False,
        ),
    ] = None,
    grace: Annotated[
        str,
        typer.Option(
            metavar='DURATION',
            help='Keep unreferenced blobs put more recently than this (30s, 15m, 1h, 2d; 0 for none).',
        ),
    ] = '1h',
    dry_run: Annotated[bool, typer.Option('--dry-run', help='Report what would be removed; remove nothing.')] = False,
    as_json: JsonOption = False,
) -> None:
    """Remove media blobs that no snapshot references any more (those of deleted runs and pruned snapshots)."""
    from stepcore.cli.collect import gc_report_json, parse_duration, print_gc_report, run_gc
    from stepcore.maintenance.gc import GcReport

    try:
        window = parse_duration(grace)
    except ValueError as exc:
        fail(str(exc))

    async def main() -> GcReport:
        # Resolved inside `run`, so a missing --store is one `error:` line like every other command's.
        return await run_gc(resolve_store_url(store), media, grace=window, dry_run=dry_run)

    report = run(main())
    if as_json:
        echo_json(gc_report_json(report))
    else:
        print_gc_report(report, out())


def rekey(
    store: StoreOption = None,
    keys_env: Annotated[
        str | None,
        typer.Option(
            '--keys-env',
            metavar='VARIABLE',
            help='Environment variable holding the keys (`new=<base64>;old=<base64>;active=new`).',
            show_default=False,
        ),
    ] = None,
    key_file: Annotated[
        Path | None,
        typer.Option('--key-file', metavar='PATH', help='Key file holding the keys, one `id=<base64>` a line.'),
    ] = None,
    journal: Annotated[
        Path,
        typer.Option(
            '--journal',
            metavar='FOLDER',
            help='Where a run waits, encrypted, between its deletion and its rewrite (resumes a stopped rekey).',
        ),
    ] = Path('.stepcore-rekey'),
) -> None:
    """Re-encrypt every run of a store under the active key (safe to stop and run again)."""
    from stepcore.cli.rekey import rekey_store
    from stepcore.common.features import ENCRYPTION

    options: dict[str, Any] = {}
    if keys_env is not None:
        options['encryption_env'] = keys_env
    if key_file is not None:
        options['encryption_key_file'] = str(key_file)

    async def main() -> Any:
        s = open_store(resolve_store_url(store), **options)
        try:
            if ENCRYPTION not in type(s).features:
                raise ValueError(
                    f'this store does not declare the feature {ENCRYPTION!r}, so its runs cannot be re-encrypted '
                    '(`stepcore plugins` lists the features of each backend)'
                )
            with progress('re-encrypting') as bar:
                return await rekey_store(s, journal, progress=lambda _run: bar.advance())
        finally:
            await s.aclose()

    report = run(main())
    resumed = f', {len(report.resumed)} resumed from the journal' if report.resumed else ''
    err().print(
        f'rewrote {len(report.rewritten)} run(s) under the active key{resumed}; {report.skipped} already under it',
        highlight=False,
    )


def check(store: StoreOption = None, as_json: JsonOption = False) -> None:
    """Check a whole store: the backend's own integrity check, then every record of every run read back.

    Exit status 0 when nothing is wrong, 1 when something is (listed by run).
    """
    from stepcore.maintenance.check import StoreCheck, check_store

    async def body(s: StepStore) -> StoreCheck:
        with progress('checking runs') as bar:
            return await check_store(s, progress=bar.update)

    report = with_store(store, body)
    if as_json:
        echo_json(
            {
                'ok': report.ok,
                'runs': report.runs,
                'integrity': report.integrity,
                'damaged': report.damaged,
                'errors': report.errors,
                'uncounted': report.uncounted,
            }
        )
    else:
        console = out()
        if report.integrity is None:
            console.print(Text('integrity check: this backend has none of its own'))
        elif report.integrity:
            console.print(Text(f'integrity check: {len(report.integrity)} problem(s)'))
            for line in report.integrity:
                console.print(Text(f'  {line}'))
        else:
            console.print(Text('integrity check: ok'))
        for line in report.errors:
            console.print(Text(line))
        for run_id, problems in report.damaged.items():
            console.print(Text(f'run {run_id}: {len(problems)} damaged'))
            for line in problems:
                console.print(Text(f'  {line}'))
        if report.uncounted:
            console.print(
                Text(
                    f'{len(report.uncounted)} run(s) without a count of their records (written without a lease, '
                    'or by an older release): records missing at their end cannot be told'
                )
            )
        verdict = 'no damage found' if report.ok else f'damage found in {len(report.damaged)} run(s)'
        console.print(Text(f'{report.runs} run(s) read: {verdict}'))
    if not report.ok:
        raise typer.Exit(1)
