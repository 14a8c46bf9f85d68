"""What every command shares: its consoles, options, error line, store opening and progress bar."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from stepcore.cli._loop import run_coroutine
from stepcore.cli.stores import ENV_VAR, open_store, resolve_store_url
from stepcore.store.leases import RunCancelledError, RunClaimedError, RunFencedError, RunOwnedError
from stepcore.store.step_store import StepStore

__all__ = (
    'DEBUG_VAR',
    'EXIT_FAILED',
    'EXIT_OK',
    'EXIT_REFUSED',
    'EXIT_USAGE',
    'EXIT_WAITING',
    'CliError',
    'JsonOption',
    'ProgressBar',
    'RunArgument',
    'StoreOption',
    'echo_json',
    'err',
    'error_text',
    'exit_code',
    'explain',
    'fail',
    'out',
    'progress',
    'resolve_run_id',
    'run',
    'store_option',
    'with_run',
    'with_store',
)

T = TypeVar('T')


def out() -> Console:
    # Made per use, so COLUMNS, NO_COLOR and redirected streams are read when the command runs.
    return Console()


def err() -> Console:
    return Console(stderr=True)


DEBUG_VAR = 'STEPCORE_DEBUG'


def store_option(help: str) -> Any:
    """The `--store URL` option (`-s`), with its help."""
    return typer.Option('--store', '-s', metavar='URL', help=help, show_default=False)


StoreOption = Annotated[
    str | None,
    store_option(
        f'Store URL, e.g. sqlite:///runs.db, file:///path/runs, mongodb://host/db, postgresql://host/db '
        f'(default: ${ENV_VAR}); `stepcore plugins` lists the URLs installed backends answer to.'
    ),
]
JsonOption = Annotated[bool, typer.Option('--json', help='Print JSON for scripts instead of a table.')]
RunArgument = Annotated[
    str,
    typer.Argument(metavar='RUN', help='The run id, or a prefix that only one run id starts with.', show_default=False),
]


EXIT_OK = 0
"""Done, or nothing was left to do (a run that already finished)."""
EXIT_FAILED = 1
"""Something failed or was refused: an unknown run, a bad store URL, a run that cannot be resumed."""
EXIT_USAGE = 2
"""The command line itself is wrong: an unknown command or option, a missing argument (typer's own)."""
EXIT_REFUSED = 3
"""Refused because another process owns or claimed the run: try again later, or see who holds it."""
EXIT_WAITING = 4
"""The run waits for a person: deferred calls to answer, or calls to settle by hand."""


class CliError(Exception):
    """A failure told in the command line's words, with the exit status it ends the command with."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print `message` as one `error:` line on stderr and exit with status `code` (1 unless given)."""
    err().print(Text.assemble(('error:', 'bold red'), f' {message}'), soft_wrap=True)
    raise typer.Exit(code)


def error_text(exc: BaseException) -> str:
    """What went wrong, in the command line's words: see `explain`."""
    return explain(exc).message


def exit_code(exc: BaseException) -> int:
    """The exit status a command ends with when `exc` stops it: see `explain`."""
    return explain(exc).code


def explain(exc: BaseException, *, action: str | None = None, force: str | None = None) -> CliError:
    """`exc` told in the command line's words, with its exit status.

    `action` names what the command was doing (e.g. `--supply call-1`, `resuming it`) for the errors
    that say what was refused; `force` is the command's flag that acts on a live run anyway
    (`--force`), offered when a live owner refused it. Another process holding or claiming the run
    exits with `EXIT_REFUSED`; everything else with `EXIT_FAILED`.
    """
    from stepcore.cli import words

    if isinstance(exc, CliError):
        return exc
    return CliError(words.message(exc, action=action, force=force), _exit_code_of(exc))


def _exit_code_of(exc: BaseException) -> int:
    if isinstance(exc, RunCancelledError):
        return EXIT_FAILED  # cancelled for good: waiting will not help
    if isinstance(exc, RunFencedError):
        return EXIT_FAILED if exc.lease is not None and exc.lease.cancelled else EXIT_REFUSED
    if isinstance(exc, RunOwnedError | RunClaimedError):
        return EXIT_REFUSED
    return EXIT_FAILED


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's async body; a failure becomes one `error:` line on stderr and its exit status
    (see `explain`), or, with `STEPCORE_DEBUG=1`, the whole traceback."""
    try:
        return run_coroutine(coro)
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:
        if os.environ.get(DEBUG_VAR):
            raise
        explained = explain(exc)
        fail(explained.message, explained.code)


def with_store(url: str | None, body: Callable[[StepStore], Awaitable[T]], *, must_exist: bool = True) -> T:
    async def main() -> T:
        store = open_store(resolve_store_url(url), must_exist=must_exist)
        try:
            return await body(store)
        finally:
            await store.aclose()

    return run(main())


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


PREFIX_CANDIDATES_SHOWN = 10
"""How many of the runs an ambiguous run-id prefix matches an error lists."""


async def resolve_run_id(store: StepStore, run_id: str) -> str:
    """The stored run `run_id` names: the run with that id, else the only run whose id starts with it."""
    if not run_id:
        raise LookupError('no run id given: pass a run id, or the start of one (list them with `stepcore runs`)')
    if await store.get_run(run_id=run_id) is not None:
        return run_id
    matches = sorted(r.run_id for r in await store.list_runs() if r.run_id.startswith(run_id))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(
            f'run {run_id!r} not found in this store, and no run id starts with it: '
            'list the stored runs with `stepcore runs`'
        )
    shown = ', '.join(matches[:PREFIX_CANDIDATES_SHOWN])
    if len(matches) > PREFIX_CANDIDATES_SHOWN:
        shown += f', and {len(matches) - PREFIX_CANDIDATES_SHOWN} more'
    raise LookupError(
        f'run id prefix {run_id!r} is ambiguous: {len(matches)} runs start with it ({shown}); give more of the id'
    )


def with_run(url: str | None, run_id: str, body: Callable[[StepStore, str], Awaitable[T]]) -> tuple[str, T]:
    """Open the store, resolve `run_id` (a full id or a unique prefix) and run `body` with the full id."""

    async def resolved(store: StepStore) -> tuple[str, T]:
        rid = await resolve_run_id(store, run_id)
        return rid, await body(store, rid)

    return with_store(url, resolved)


class ProgressBar:
    """The bar `progress` shows: moved on by `advance`, set by `update`; `next` goes on with a new one."""

    def __init__(self, display: Progress, description: str, total: int | None) -> None:
        self._display = display
        self._task = display.add_task(description, total=total)

    def advance(self, n: int = 1, *, description: str | None = None) -> None:
        """Move the bar on by `n`, and show `description` from now on when one is given."""
        self._display.update(self._task, advance=n, description=description)

    def update(self, done: int, total: int | None = None) -> None:
        """Set how much is done of `total` (None: the total is unknown, or stays what it was)."""
        self._display.update(self._task, completed=done, total=total)

    def next(self, description: str, total: int | None = None) -> None:
        """Leave this bar where it stands and go on with a new one below it."""
        self._task = self._display.add_task(description, total=total)


@contextmanager
def progress(description: str, total: int | None = None) -> Iterator[ProgressBar]:
    """A progress bar on stderr, shown only when stderr is a terminal; `total` is None while unknown.

    Descriptions are shown as they are, never read as markup: they may hold a run id.
    """
    stderr = err()
    with Progress(
        TextColumn('{task.description}', markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        disable=not stderr.is_terminal,
        transient=True,
    ) as display:
        yield ProgressBar(display, description, total)
