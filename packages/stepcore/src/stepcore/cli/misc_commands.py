"""`demo`, `plugins` and `ui`: the commands that show stepcore itself rather than a store's runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from stepcore.cli.console import DEBUG_VAR, JsonOption, StoreOption, echo_json, error_text, fail, out
from stepcore.cli.stores import StoreError, resolve_store_url
from stepcore.plugins.registry import RegisteredBackend, get_registry

__all__ = ('demo', 'plugins', 'ui')


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
    table = Table(title='stepcore plugins')
    for column in ('distribution', 'version', 'kind', 'key', 'URL', 'features', 'summary'):
        table.add_column(column)
    for p in found:
        for row in rows[id(p)]:
            features = Text(', '.join(row['features']))
            if 'unavailable' in row:
                features = Text(f'unavailable: {row["unavailable"]}', style='red')
            shown = (p.distribution, p.version, row['kind'], row['key'], ', '.join(row['urls']))
            table.add_row(*map(Text, shown), features, Text(row['summary']))
    out().print(table)


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
