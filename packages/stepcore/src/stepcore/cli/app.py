"""Command definitions."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from ..registry import get_registry

app = typer.Typer(help='Inspect and recover agent runs persisted by stepcore.', no_args_is_help=True)
console = Console()


@app.callback()
def _root() -> None:
    """Inspect and recover agent runs persisted by stepcore."""


@app.command()
def plugins(as_json: bool = typer.Option(False, '--json', help='Print JSON for scripts.')) -> None:
    """List installed plugins, their versions, backend keys and features."""
    registry = get_registry()
    rows = [
        {
            'plugin': p.name,
            'distribution': p.distribution,
            'version': p.version,
            'backends': [
                {'kind': b.kind, 'key': b.info.key, 'features': sorted(b.info.features), 'summary': b.info.summary}
                for b in p.backends
            ],
        }
        for p in sorted(registry.plugins, key=lambda p: p.distribution)
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title='stepcore plugins')
    for column in ('distribution', 'version', 'kind', 'key', 'features', 'summary'):
        table.add_column(column)
    for row in rows:
        for b in row['backends']:
            table.add_row(row['distribution'], row['version'], b['kind'], b['key'], ', '.join(b['features']), b['summary'])
    console.print(table)


def main() -> None:
    app()
