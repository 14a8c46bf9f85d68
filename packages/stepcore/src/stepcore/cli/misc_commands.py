"""`demo`, `plugins` and `ui`: the commands that show stepcore itself rather than a store's runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from stepcore.cli.console import DEBUG_VAR, JsonOption, StoreOption, echo_json, error_text, fail, out
from stepcore.cli.fitting import fit
from stepcore.cli.stores import StoreError, resolve_store_url
from stepcore.cli.words import strip_error_class
from stepcore.plugins.registry import RegisteredBackend, get_registry

__all__ = ('demo', 'plugins', 'plugins_table', 'ui')


def demo(
    database: Annotated[Path, typer.Option('--database', help='SQLite file to write (replaced if it exists).')] = Path(
        'stepcore-demo.db'
    ),
) -> None:
    """Run an agent, kill its process mid tool call, inspect what was saved, and resume it."""
    from stepcore.cli.demo import DemoError, run_demo

    try:
        run_demo(database, console=out())
    except DemoError as exc:
        fail(str(exc))
    except Exception as exc:
        if os.environ.get(DEBUG_VAR):
            raise
        fail(error_text(exc))


def _backend_row(backend: RegisteredBackend) -> dict[str, Any]:
    """What `plugins` shows of one backend; its features come from the store class, imported here."""
    info = backend.info
    urls = [f'{s}://' for s in info.schemes] or ([f'{info.key}://'] if backend.kind == 'step' else [])
    row: dict[str, Any] = {'kind': backend.kind, 'key': info.key, 'urls': urls, 'summary': info.summary}
    try:
        row['features'] = sorted(backend.features())
    except Exception as exc:  # a driver not installed, or a plugin naming a class that is not there
        row['features'] = []
        row['unavailable'] = f'{type(exc).__name__}: {exc}'
    return row


def plugins(as_json: JsonOption = False) -> None:
    """List installed plugins, their versions, backend keys, store URLs and features."""
    found = sorted(get_registry().plugins, key=lambda p: p.distribution)
    rows = {id(p): [_backend_row(b) for b in p.backends] for p in found}
    if as_json:
        echo_json(
            [
                {'plugin': p.name, 'distribution': p.distribution, 'version': p.version, 'backends': rows[id(p)]}
                for p in found
            ]
        )
        return
    console = out()
    console.print(plugins_table([(p.distribution, p.version, rows[id(p)]) for p in found], width=console.width))


def plugins_table(plugins: list[tuple[str, str, list[dict[str, Any]]]], *, width: int | None = None) -> Table:
    """One row per backend: its distribution and version, its key and kind, the URLs that open it, and
    its summary with its features on the line below (wrapped, never cut)."""
    table = Table(title='stepcore plugins')
    table.add_column('distribution', overflow='fold')
    table.add_column('backend', overflow='fold')
    table.add_column('URLs', overflow='fold')
    table.add_column('summary and features')
    for distribution, version, backends in plugins:
        for row in backends:
            about = Text(row['summary'])
            if 'unavailable' in row:
                about.append(f'\nunavailable: {strip_error_class(row["unavailable"])}', style='red')
            else:
                about.append('\nfeatures: ', style='dim')
                about.append(', '.join(row['features']) or 'none')
            table.add_row(
                Text(f'{distribution}\n{version}'),
                Text(f'{row["key"]}\n{row["kind"]} store'),
                Text('\n'.join(row['urls']) or '-'),
                about,
            )
    return table if width is None else fit(table, width)


_UI_PACKAGES = ('starlette', 'jinja2', 'markupsafe', 'uvicorn')


def ui(
    store: StoreOption = None,
    host: Annotated[
        str, typer.Option(help='Address to listen on. Anything but loopback lets others on the network read the runs.')
    ] = '127.0.0.1',
    port: Annotated[int, typer.Option(help='Port to listen on (0: any free port).')] = 8765,
    open_browser: Annotated[bool, typer.Option('--open', help='Open the page in a web browser.')] = False,
    media: Annotated[
        str | None,
        typer.Option(help='The media store of the runs, as KEY://?option=value (e.g. disk://?directory=DIR).'),
    ] = None,
) -> None:
    """Browse the stored runs in a local, read-only web page."""
    try:
        from stepcore.ui.server import UiError, serve
    except ImportError as exc:
        if exc.name and exc.name.split('.')[0] in _UI_PACKAGES:
            fail(f'stepcore ui needs the ui extra ({exc.name} is not installed): pip install "stepcore[ui]"')
        raise
    try:
        serve(resolve_store_url(store), host=host, port=port, open_browser=open_browser, media_url=media)
    except (UiError, StoreError, ValueError, OSError) as exc:
        fail(error_text(exc))
    except KeyboardInterrupt:
        pass
