"""The `stepcore` command: its root options, and every command in the order its help lists them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
import typer.core

from stepcore.cli.console import store_option
from stepcore.cli.inspect_commands import effects, events, job, runs, show, snapshots, tree
from stepcore.cli.maintenance_commands import check, export_command, gc, import_command, prune, rekey
from stepcore.cli.misc_commands import demo, plugins, ui
from stepcore.cli.recovery_commands import answer, cancel, recover, resume
from stepcore.cli.scaffold import new_backend_command
from stepcore.cli.stores import ENV_VAR
from stepcore.common.version import VERSION as __version__

__all__ = ('app', 'main')


class _CommandGroup(typer.core.TyperGroup):
    """The `stepcore` group: its commands' help shows a flag as a flag.

    Typer's rich help prints the type of every option, so a flag such as `--json` reads
    `--json <bool>` as if it took a value. A flag (an option taking no value) gets an empty metavar
    here, which leaves that column blank; options that take a value keep theirs.
    """

    def get_params(self, ctx: Any) -> Any:
        return _show_flags_as_flags(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _show_flags_as_flags(command.get_params(ctx))
        return command


def _show_flags_as_flags(params: list[Any]) -> list[Any]:
    for param in params:
        if isinstance(param, typer.core.TyperOption) and param.is_flag and not param.count and param.metavar is None:
            param.metavar = ''
    return params


app = typer.Typer(
    cls=_CommandGroup,
    help='Inspect and recover agent runs persisted by stepcore.',
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        pydantic_ai = version('pydantic-ai-slim')
    except PackageNotFoundError:  # pragma: no cover - stepcore requires it
        pydantic_ai = 'not installed'
    python = '.'.join(str(n) for n in sys.version_info[:3])
    typer.echo(f'stepcore {__version__} (pydantic-ai {pydantic_ai}, Python {python})')
    raise typer.Exit()


@app.callback()
def cli_root(
    ctx: typer.Context,
    store: Annotated[
        str | None,
        store_option(
            f'Store URL for every command that reads or writes one (default: ${ENV_VAR}); '
            "a command's own --store overrides it."
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            '--version', callback=_print_version, is_eager=True, help='Print the versions of stepcore and pydantic-ai.'
        ),
    ] = False,
) -> None:
    """Inspect and recover agent runs persisted by stepcore."""
    del version
    if store:
        # The store becomes the default of every command's own --store option.
        group = ctx.command
        names = group.list_commands(ctx) if isinstance(group, typer.core.TyperGroup) else []
        defaults: dict[str, Any] = dict(ctx.default_map or {})
        for name in names:
            defaults[name] = {**defaults.get(name, {}), 'store': store}
        ctx.default_map = defaults


_COMMANDS: tuple[tuple[str, Callable[..., Any]], ...] = (
    ('demo', demo),
    ('plugins', plugins),
    ('runs', runs),
    ('job', job),
    ('tree', tree),
    ('events', events),
    ('snapshots', snapshots),
    ('show', show),
    ('effects', effects),
    ('recover', recover),
    ('answer', answer),
    ('resume', resume),
    ('cancel', cancel),
    ('prune', prune),
    ('export', export_command),
    ('import', import_command),
    ('gc', gc),
    ('check', check),
    ('rekey', rekey),
    ('ui', ui),
    ('new-backend', new_backend_command),
)
for name, command in _COMMANDS:
    app.command(name)(command)


def main() -> None:
    app()
