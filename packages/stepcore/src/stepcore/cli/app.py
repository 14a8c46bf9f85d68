"""Command definitions."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar, cast

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from stepcore.cli import render
from stepcore.cli._loop import run_coroutine
from stepcore.cli.stores import ENV_VAR, StoreError, open_store, resolve_store_url
from stepcore.cli.transfer import (
    RunExport,
    descendant_ids,
    dump_export,
    export_runs,
    import_runs,
    parse_export,
)
from stepcore.common.version import VERSION as __version__
from stepcore.ownership.claims import has_leases
from stepcore.plugins.registry import RegisteredBackend, get_registry
from stepcore.recovery.standing import LEASE_STATUSES, Standing, runs_by_lease, standings_of
from stepcore.store.codec import dump_record
from stepcore.store.lifecycle import PruneReport, RunStatus, parse_duration
from stepcore.store.models import utcnow
from stepcore.store.step_store import StepStore

__all__ = ('app', 'main')

T = TypeVar('T')


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


def _out() -> Console:
    # Made per use, so COLUMNS, NO_COLOR and redirected streams are read when the command runs.
    return Console()


def _err() -> Console:
    return Console(stderr=True)


DEBUG_VAR = 'STEPCORE_DEBUG'

StoreOption = Annotated[
    str | None,
    typer.Option(
        '--store',
        '-s',
        metavar='URL',
        help=(
            f'Store URL, e.g. sqlite:///runs.db, file:///path/runs, mongodb://host/db, postgresql://host/db '
            f'(default: ${ENV_VAR}); `stepcore plugins` lists the URLs installed backends answer to.'
        ),
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option('--json', help='Print JSON for scripts instead of a table.')]
RunArgument = Annotated[
    str,
    typer.Argument(metavar='RUN', help='The run id, or a prefix that only one run id starts with.', show_default=False),
]


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
        typer.Option(
            '--store',
            '-s',
            metavar='URL',
            help=(
                f'Store URL for every command that reads or writes one (default: ${ENV_VAR}); '
                "a command's own --store overrides it."
            ),
            show_default=False,
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


def _fail(message: str) -> NoReturn:
    _err().print(f'[bold red]error:[/] {escape(message)}', highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, StoreError | LookupError | ValueError):
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    elif isinstance(exc, OSError):
        where = f' {exc.filename!r}' if exc.filename else ''
        text = f'{exc.strerror or exc}{where}'
    else:
        text = f'{type(exc).__name__}: {exc}'
    return text or type(exc).__name__


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's async body, turning a user error into one line on stderr and exit code 1."""
    try:
        return run_coroutine(coro)
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:
        if os.environ.get(DEBUG_VAR):
            raise
        _fail(_error_text(exc))


def _with_store(url: str | None, body: Callable[[StepStore], Awaitable[T]], *, must_exist: bool = True) -> T:
    async def main() -> T:
        store = open_store(resolve_store_url(url), must_exist=must_exist)
        try:
            return await body(store)
        finally:
            await store.aclose()

    return _run(main())


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


PREFIX_CANDIDATES_SHOWN = 10
"""How many of the runs an ambiguous run-id prefix matches an error lists."""


async def _resolve_run(store: StepStore, run_id: str) -> str:
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


def _with_run(url: str | None, run_id: str, body: Callable[[StepStore, str], Awaitable[T]]) -> tuple[str, T]:
    """Open the store, resolve `run_id` (a full id or a unique prefix) and run `body` with the full id."""

    async def resolved(store: StepStore) -> tuple[str, T]:
        rid = await _resolve_run(store, run_id)
        return rid, await body(store, rid)

    return _with_store(url, resolved)


@contextmanager
def _progress(description: str, total: int | None):
    """A progress bar on stderr, shown only when stderr is a terminal."""
    stderr = Console(stderr=True)
    with Progress(
        TextColumn('{task.description}'),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        disable=not stderr.is_terminal,
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=total)

        def advance(n: int) -> None:
            progress.advance(task, n)

        yield advance


@contextmanager
def _progress_of(description: str):
    """A progress bar on stderr (only when it is a terminal), fed `(done, total)` as work proceeds."""
    stderr = Console(stderr=True)
    with Progress(
        TextColumn('{task.description}'),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        disable=not stderr.is_terminal,
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


# --- demo ----------------------------------------------------------------------------------------


@app.command()
def demo(
    database: Annotated[Path, typer.Option('--database', help='SQLite file to write (replaced if it exists).')] = Path(
        'stepcore-demo.db'
    ),
) -> None:
    """Run an agent, kill its process mid tool call, inspect what was saved, and resume it."""
    from stepcore.cli.demo import DemoError, run_demo

    try:
        run_demo(database, console=_out())
    except DemoError as exc:
        _fail(str(exc))
    except Exception as exc:
        if os.environ.get(DEBUG_VAR):
            raise
        _fail(_error_text(exc))


# --- plugins -------------------------------------------------------------------------------------


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


@app.command()
def plugins(as_json: JsonOption = False) -> None:
    """List installed plugins, their versions, backend keys, store URLs and features."""
    found = sorted(get_registry().plugins, key=lambda p: p.distribution)
    rows = {id(p): [_backend_row(b) for b in p.backends] for p in found}
    if as_json:
        _echo_json(
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
            urls = ', '.join(row['urls'])
            table.add_row(p.distribution, p.version, row['kind'], row['key'], urls, features, row['summary'])
    _out().print(table)


# --- listings ------------------------------------------------------------------------------------


def _moment_option(value: str | None, option: str) -> datetime | None:
    """An ISO date or date-time (naive: UTC), or an age such as `7d` meaning that long ago."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        try:
            return utcnow() - parse_duration(value)
        except ValueError:
            _fail(
                f'{option} {value!r} is neither a date nor an age: give an ISO date or date-time '
                '(2026-11-30, 2026-11-30T08:00:00+01:00) or an age such as 7d, 12h or 90m'
            )
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@app.command()
def runs(
    store: StoreOption = None,
    conversation: Annotated[str | None, typer.Option(help='Only runs of this conversation_id.')] = None,
    parent: Annotated[str | None, typer.Option(help='Only runs delegated from this run id.')] = None,
    agent: Annotated[str | None, typer.Option(help='Only runs of this agent name.')] = None,
    status: Annotated[
        str | None,
        typer.Option(
            metavar='STATUS',
            help='Only runs with this status: completed, failed, unfinished or waiting (paused on deferred tool '
            'calls, not resumed yet); or, from their leases: running, orphaned, pending or resumed.',
        ),
    ] = None,
    after: Annotated[
        str | None,
        typer.Option(
            metavar='WHEN', help='Only runs started after this: an ISO date/time, or an age (7d: 7 days ago).'
        ),
    ] = None,
    before: Annotated[
        str | None,
        typer.Option(metavar='WHEN', help='Only runs started before this: an ISO date/time, or an age (30d).'),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help='Show at most this many of the newest matching runs.')] = 50,
    offset: Annotated[int, typer.Option(min=0, help='Skip this many of the newest matching runs.')] = 0,
    as_json: JsonOption = False,
) -> None:
    """List runs, oldest first and newest last (filters combine with AND).

    Only the runs shown are read: the store filters and pages (newest first) in its own query. On a
    store that keeps leases the status says more than the events do: a run running in a process, an
    orphan (its owner gone), one waiting for answers, pending a person, or resumed by another run.
    """
    started_after = _moment_option(after, '--after')
    started_before = _moment_option(before, '--before')

    async def body(s: StepStore) -> tuple[list[Any], list[Standing], bool]:
        # `waiting` is told by events too: a store without leases answers it from them
        by_lease = status in LEASE_STATUSES and (status != 'waiting' or has_leases(s))
        options: dict[str, Any] = {
            'conversation_id': conversation,
            'parent_run_id': parent,
            'agent_name': agent,
            'started_after': started_after,
            'started_before': started_before,
        }
        if by_lease:
            found = await runs_by_lease(s, cast(str, status), **options)
        else:
            found = await s.list_runs(
                **options, status=cast(RunStatus | None, status), limit=offset + limit + 1, newest_first=True
            )
        page = found[offset : offset + limit][::-1]
        return page, await standings_of(s, [r.run_id for r in page]), len(found) > offset + limit

    page, standings, more = _with_store(store, body)
    statuses = [st.label for st in standings]
    if as_json:
        _echo_json(
            [
                {**dump_record(r), 'status': st.status, 'ownership': st.ownership, 'standing': st.label}
                for r, st in zip(page, standings, strict=True)
            ]
        )
        return
    if not page:
        filtered = any(v is not None for v in (conversation, parent, agent, status, after, before)) or offset
        _out().print('no runs match' if filtered else 'no runs in this store')
        return
    _out().print(render.runs_table(page, statuses))
    if more or offset:
        hint = f'; use --offset {offset + len(page)} for older ones' if more else ''
        _out().print(f'newest runs {offset + 1}-{offset + len(page)} shown (oldest first){hint}', style='dim')


@app.command()
def tree(run_id: RunArgument, store: StoreOption = None, as_json: JsonOption = False) -> None:
    """Show a run and the runs delegated from it, with their status."""

    async def build(s: StepStore, rid: str, seen: set[str]) -> render.RunNode:
        record = await s.get_run(run_id=rid)
        if record is None:
            raise LookupError(f'run {rid!r} not found in this store: list the stored runs with `stepcore runs`')
        seen.add(rid)
        status = render.run_status(await s.list_events_page(rid, newest=True, limit=1))
        unresolved = len(await s.list_unresolved_tool_effects(run_id=rid))
        children = [
            await build(s, child.run_id, seen)
            for child in await s.list_runs(parent_run_id=rid)
            if child.run_id not in seen
        ]
        return render.RunNode(record, status, unresolved, children)

    _, root = _with_run(store, run_id, lambda s, rid: build(s, rid, set()))
    if as_json:
        _echo_json(root.as_json())
        return
    _out().print(render.run_tree(root))


@app.command()
def events(run_id: RunArgument, store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List a run's step events in the order they were appended."""

    async def body(s: StepStore, rid: str) -> list[Any]:
        return await s.list_events(run_id=rid)

    run_id, found = _with_run(store, run_id, body)
    if as_json:
        _echo_json([dump_record(e) for e in found])
        return
    _out().print(render.events_table(found, title=f'events of {run_id}'))


@app.command()
def snapshots(run_id: RunArgument, store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List a run's retained snapshots (see `show` for their messages)."""

    async def body(s: StepStore, rid: str) -> list[Any]:
        return await s.list_snapshots(run_id=rid, include_interrupted=True)

    run_id, found = _with_run(store, run_id, body)
    if as_json:
        _echo_json([{**dump_record(x, exclude={'messages'}), 'message_count': len(x.messages)} for x in found])
        return
    if not found:
        _out().print(f'run {run_id} has no snapshots')
        return
    _out().print(render.snapshots_table(found, title=f'snapshots of {run_id}'))


@app.command()
def show(
    run_id: RunArgument,
    seq: Annotated[int | None, typer.Option(help='Show this snapshot instead of the newest one.')] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the messages of a run's newest snapshot (of any state), or of snapshot --seq N."""
    from stepcore.cli.transfer import _dump_snapshot  # pyright: ignore[reportPrivateUsage]

    async def body(s: StepStore, rid: str) -> Any:
        if seq is None:
            snap = await s.latest_snapshot(run_id=rid, include_interrupted=True)
            if snap is None:
                raise LookupError(f'run {rid!r} has no snapshot yet: see its events with `stepcore events {rid}`')
            return snap
        retained = await s.list_snapshots(run_id=rid, include_interrupted=True)
        for snap in retained:
            if snap.seq == seq:
                return snap
        have = ', '.join(str(x.seq) for x in retained) or 'none'
        raise LookupError(f'run {rid!r} has no snapshot with seq {seq}; retained seqs: {have}')

    run_id, snap = _with_run(store, run_id, body)
    if as_json:
        _echo_json(_dump_snapshot(snap))
        return
    header = Text()
    header.append(f'{run_id}', style='bold')
    header.append(f'  snapshot seq {snap.seq}, step {snap.step_index}, ')
    header.append(snap.state.value, style='green' if snap.state.value == 'complete' else 'yellow')
    header.append(f', {len(snap.messages)} messages')
    _out().print(header)
    _out().print(render.render_messages(snap.messages))


@app.command()
def effects(
    run_id: RunArgument,
    unresolved: Annotated[bool, typer.Option('--unresolved', help='Only calls started with no outcome.')] = False,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """List a run's tool-effect ledger: which tool calls completed, failed, or may or may not have run."""

    async def body(s: StepStore, rid: str) -> list[Any]:
        return await (s.list_unresolved_tool_effects(run_id=rid) if unresolved else s.list_tool_effects(run_id=rid))

    run_id, found = _with_run(store, run_id, body)
    if as_json:
        _echo_json([dump_record(e) for e in found])
        return
    if not found:
        _out().print(f'run {run_id} has no {"unresolved " if unresolved else ""}tool effects')
        return
    _out().print(render.effects_table(found, title=f'tool effects of {run_id}'))


@app.command()
def recover(
    run_id: Annotated[
        str | None,
        typer.Argument(
            metavar='[RUN]',
            help='The run id, or a prefix that only one run id starts with (not with --orphans).',
            show_default=False,
        ),
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
    supply: Annotated[
        list[str] | None,
        typer.Option(
            '--supply',
            metavar='CALL=RESULT',
            help='Settle tool call CALL, checked by hand, with the result the model gets (JSON or text). Repeatable.',
        ),
    ] = None,
    mark_checked: Annotated[
        list[str] | None,
        typer.Option(
            '--mark-checked',
            metavar='CALL',
            help='Settle tool call CALL, checked by hand: its effect is in place. Repeatable.',
        ),
    ] = None,
    rerun: Annotated[
        list[str] | None,
        typer.Option(
            '--rerun',
            metavar='CALL',
            help='Settle tool call CALL, checked by hand: it did NOT happen, run it again on resume. Repeatable.',
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            '--force',
            help='Settle even a call the crash did not cut short, or one already answered, or a run whose lease '
            'is live: for a person who knows its owner is gone.',
        ),
    ] = False,
    orphans: Annotated[
        bool,
        typer.Option('--orphans', help='Resume every orphaned run of the store this worker has an --agent for.'),
    ] = False,
    agent_specs: Annotated[
        list[str] | None,
        typer.Option(
            '--agent',
            metavar='MODULE:ATTR',
            help='With --orphans: an agent that resumes the runs recorded under its name. Repeatable.',
        ),
    ] = None,
    watch: Annotated[
        bool, typer.Option('--watch', help='With --orphans: keep looking for orphans until interrupted.')
    ] = False,
    interval: Annotated[
        float, typer.Option(min=0.1, help='With --watch: seconds between two looks for orphans.')
    ] = 10.0,
) -> None:
    """Explain what a run left behind and how it can be resumed; settle calls you checked by hand.

    With --orphans, resume every orphaned run (its owner gone or its lease expired) that one of the
    --agent agents runs: each is claimed first, so several workers can do it at once safely.
    """
    from stepcore.cli.recovery_view import describe_recovery, parse_supplied, recovery_json

    if orphans:
        if run_id is not None or supply or mark_checked or rerun:
            _fail('--orphans resumes every orphan: give no RUN, --supply, --mark-checked or --rerun with it')
        _recover_orphans(store, agent_specs or [], watch=watch, interval=interval, as_json=as_json)
        return
    if run_id is None:
        _fail('name the run to recover (RUN), or pass --orphans to resume every orphaned run')
    supplied = [parse_supplied(item) for item in supply or ()]

    async def body(s: StepStore, rid: str) -> Any:
        from stepcore.recovery import inspect_recovery
        from stepcore.recovery.resolution import mark_checked as check
        from stepcore.recovery.resolution import rerun_call, supply_result

        for call_id, result in supplied:
            await supply_result(s, run_id=rid, tool_call_id=call_id, result=result, force=force)
        for call_id in mark_checked or ():
            await check(s, run_id=rid, tool_call_id=call_id, force=force)
        for call_id in rerun or ():
            await rerun_call(s, run_id=rid, tool_call_id=call_id, force=force)
        return await inspect_recovery(store=s, run_id=rid)

    run_id, report = _with_run(store, run_id, body)
    if as_json:
        _echo_json(recovery_json(report))
        return
    _out().print(describe_recovery(run_id, report))


@app.command()
def answer(
    run_id: RunArgument,
    tool_call_id: Annotated[
        str, typer.Argument(metavar='CALL', help='The id of the deferred tool call to answer.', show_default=False)
    ],
    approve: Annotated[bool, typer.Option('--approve', help='Approve the call: it runs when the run resumes.')] = False,
    args: Annotated[
        str | None,
        typer.Option(
            '--args', metavar='JSON', help='With --approve: the arguments the call runs with instead (a JSON object).'
        ),
    ] = None,
    deny: Annotated[bool, typer.Option('--deny', help='Deny the call: it does not run, the model is told.')] = False,
    message: Annotated[
        str | None, typer.Option('--message', metavar='TEXT', help='With --deny: what the model is told.')
    ] = None,
    result: Annotated[
        str | None,
        typer.Option(
            '--result', metavar='JSON', help='The result of a call made outside the agent (JSON, or plain text).'
        ),
    ] = None,
    fail: Annotated[
        str | None,
        typer.Option('--fail', metavar='TEXT', help='A call made outside the agent failed: what the model is told.'),
    ] = None,
    by: Annotated[
        str | None, typer.Option('--by', metavar='WHO', help='Who answers (recorded with the answer).')
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Answer a deferred tool call of a run that paused: approve or deny it, or give its result from outside.

    Each call is answered once: the first answer stands, and a different one is refused. Resume the
    run once every call is answered (`stepcore resume`).
    """
    from stepcore.cli.recovery_view import parse_json_or_text
    from stepcore.recovery.answers import answer_call, approve_call, deny_call, fail_call

    chosen = [
        flag
        for flag, given in (
            ('--approve', approve),
            ('--deny', deny),
            ('--result', result is not None),
            ('--fail', fail is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        _fail(
            'give exactly one of --approve, --deny, --result JSON or --fail TEXT'
            + (f' (got {", ".join(chosen)})' if chosen else '')
        )
    if args is not None and not approve:
        _fail('--args goes with --approve: the arguments an approved call runs with')
    if message is not None and not deny:
        _fail('--message goes with --deny: what the model is told of the denial')
    override: dict[str, Any] | None = None
    if args is not None:
        try:
            parsed = json.loads(args)
        except ValueError as exc:
            _fail(f'--args {args!r} is not JSON: {exc}; write an object such as {{"name": "guests"}}')
        if not isinstance(parsed, dict):
            _fail(f'--args {args!r} is not a JSON object: write the arguments by name, such as {{"name": "guests"}}')
        override = cast(dict[str, Any], parsed)

    async def body(s: StepStore, rid: str) -> Any:
        if approve:
            return await approve_call(s, run_id=rid, tool_call_id=tool_call_id, override_args=override, by=by)
        if deny:
            return await deny_call(s, run_id=rid, tool_call_id=tool_call_id, message=message, by=by)
        if result is not None:
            value = parse_json_or_text(result)
            return await answer_call(s, run_id=rid, tool_call_id=tool_call_id, result=value, by=by)
        assert fail is not None
        return await fail_call(s, run_id=rid, tool_call_id=tool_call_id, message=fail, by=by)

    run_id, recorded = _with_run(store, run_id, body)
    if as_json:
        _echo_json({'run_id': run_id, **recorded.to_json()})
        return
    _out().print(Text(f'{run_id} {tool_call_id}: {recorded.describe()}'))


@app.command()
def resume(
    run_id: RunArgument,
    agent_spec: Annotated[
        str,
        typer.Option('--agent', metavar='MODULE:ATTR', help='The agent that resumes the run.', show_default=False),
    ],
    force: Annotated[
        bool,
        typer.Option(
            '--force', help='Resume even a run whose lease is live: for a person who knows its owner is gone.'
        ),
    ] = False,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resume a run once: a run paused on deferred tool calls with its answers, or a run a crash cut short.

    The run is claimed first on a store that keeps leases, so of two resumers exactly one proceeds, and a
    run once resumed is never resumed again. Prints the new run's id and output.
    """
    from stepcore.recovery.answers import resume_run

    try:
        agent = _load_agent(agent_spec)
    except typer.BadParameter as exc:
        _fail(str(exc.message))

    async def body(s: StepStore, rid: str) -> Any:
        return await resume_run(s, run_id=rid, agent=agent, force=force)

    run_id, outcome = _with_run(store, run_id, body)
    output = outcome.output
    shown = output if isinstance(output, str | int | float | bool | None) else repr(output)
    if as_json:
        _echo_json({'run_id': run_id, 'resumed_as': outcome.run_id, 'output': shown})
        return
    _out().print(Text.assemble((f'{run_id}: ', 'bold'), ('resumed', 'green'), f' as {outcome.run_id}'))
    _out().print(Text(str(shown)))


def _load_agent(spec: str) -> Any:
    """The object `MODULE:ATTR` names (an agent), imported from the current directory too."""
    import importlib

    module_name, sep, attr = spec.partition(':')
    if not sep or not module_name or not attr:
        raise typer.BadParameter(f'--agent {spec!r} is not MODULE:ATTR: write e.g. myapp.agents:support_agent')
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split('.'):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise typer.BadParameter(f'--agent {spec!r}: {type(exc).__name__}: {exc}') from exc
    if not callable(getattr(found, 'run', None)):
        raise typer.BadParameter(f'--agent {spec!r} is a {type(found).__name__}, not a pydantic-ai Agent')
    return found


def _recover_orphans(url: str | None, specs: list[str], *, watch: bool, interval: float, as_json: bool) -> None:
    from stepcore.recovery.fleet import OrphanOutcome, recover_orphans, run_recovery_loop

    if not specs:
        _fail('--orphans needs the agents that run them: pass --agent MODULE:ATTR (repeatable)')
    try:
        agents = [_load_agent(spec) for spec in specs]
    except typer.BadParameter as exc:
        _fail(str(exc.message))

    def show(outcome: OrphanOutcome) -> None:
        if as_json:
            typer.echo(json.dumps(_outcome_json(outcome)))
        else:
            style = {'resumed': 'green', 'failed': 'red', 'pending': 'yellow', 'abandoned': 'yellow'}
            _out().print(
                Text.assemble(
                    (f'{outcome.run_id}: ', 'bold'),
                    (outcome.outcome, style.get(outcome.outcome, '')),
                    f' {outcome.detail}' if outcome.detail else '',
                    f' (resumed as {outcome.resumed_as})' if outcome.resumed_as else '',
                )
            )

    async def body(s: StepStore) -> int:
        if watch:
            await run_recovery_loop(s, agents, interval=interval, on_outcome=show)
            return 0
        outcomes = await recover_orphans(s, agents)
        for outcome in outcomes:
            show(outcome)
        if not outcomes and not as_json:
            _out().print('no orphaned runs')
        return sum(o.outcome == 'failed' for o in outcomes)

    failed = _with_store(url, body)
    if failed:
        raise typer.Exit(1)


def _outcome_json(outcome: Any) -> dict[str, Any]:
    return {
        'run_id': outcome.run_id,
        'outcome': outcome.outcome,
        'detail': outcome.detail,
        'resumed_as': outcome.resumed_as,
    }


# --- prune ---------------------------------------------------------------------------------------


@app.command()
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
        _fail(str(exc))

    async def body(s: StepStore) -> PruneReport:
        with _progress_of('checking runs' if dry_run else 'pruning runs') as progress:
            return await s.prune(age, conversation_id=conversation, dry_run=dry_run, progress=progress)

    report = _with_store(store, body)
    if as_json:
        _echo_json(
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
    _out().print(f'runs idle since before {render.when(report.cutoff)} UTC (their last write)')
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
    _out().print(table)
    if report.kept_active:
        _out().print(
            f'kept {len(report.kept_active)} run(s) that started before the cutoff but were written to since',
            style='dim',
        )
    if report.dry_run and report.runs:
        _out().print('dry run: nothing was removed; run again without --dry-run to remove them', style='dim')


# --- export / import -----------------------------------------------------------------------------


class ExportFormat(str, Enum):
    json = 'json'


@app.command('export')
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
        with _progress('exporting', None) as advance:
            return await export_runs(s, ids, progress=advance)

    _, exported = _with_run(store, run_id, body)
    text = json.dumps(dump_export(exported), indent=1, ensure_ascii=False)
    if output is None:
        typer.echo(text)
        return
    try:
        output.write_text(text + '\n', encoding='utf-8')
    except OSError as exc:
        _fail(f'cannot write {str(output)!r}: {exc.strerror or exc}')
    _err().print(f'exported {len(exported)} run(s) to {escape(str(output))}', highlight=False)


@app.command('import')
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
        _fail('give one thing to import: an export file, or --from-harness PATH')
    if from_harness is not None:
        from stepcore.cli.import_harness import import_from_harness

        _run(import_from_harness(from_harness, store))
        return
    assert file is not None
    try:
        text = sys.stdin.read() if str(file) == '-' else file.read_text(encoding='utf-8')
    except OSError as exc:
        _fail(f'cannot read {str(file)!r}: {exc.strerror or exc}')
    try:
        runs_in = parse_export(json.loads(text))
    except ValueError as exc:
        _fail(f'{file}: {_error_text(exc)}')

    async def body(s: StepStore) -> None:
        with _progress('importing', sum(r.size for r in runs_in)) as advance:
            await import_runs(s, runs_in, progress=advance)

    _with_store(store, body, must_exist=False)
    names = ', '.join(r.run.run_id for r in runs_in)
    _err().print(f'imported {len(runs_in)} run(s): {escape(names)}', highlight=False)


# --- gc ------------------------------------------------------------------------------------------


@app.command()
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
        _fail(str(exc))

    async def main() -> GcReport:
        # Resolved inside `_run`, so a missing --store is one `error:` line like every other command's.
        return await run_gc(resolve_store_url(store), media, grace=window, dry_run=dry_run, console=_err())

    report = _run(main())
    if as_json:
        _echo_json(gc_report_json(report))
    else:
        print_gc_report(report, _out())


# --- rekey ---------------------------------------------------------------------------------------


@app.command()
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
                    f'{type(s).__name__} does not declare feature {ENCRYPTION!r}: its runs cannot be re-encrypted'
                )
            with _progress('re-encrypting', None) as advance:
                return await rekey_store(s, journal, progress=lambda _run: advance(1))
        finally:
            await s.aclose()

    report = _run(main())
    resumed = f', {len(report.resumed)} resumed from the journal' if report.resumed else ''
    _err().print(
        f'rewrote {len(report.rewritten)} run(s) under the active key{resumed}; {report.skipped} already under it',
        highlight=False,
    )


# --- ui ------------------------------------------------------------------------------------------

_UI_PACKAGES = ('starlette', 'jinja2', 'markupsafe', 'uvicorn')


@app.command()
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
            _fail(f'stepcore ui needs the ui extra ({exc.name} is not installed): pip install "stepcore[ui]"')
        raise
    try:
        serve(resolve_store_url(store), host=host, port=port, open_browser=open_browser, media_url=media)
    except (UiError, StoreError, ValueError, OSError) as exc:
        _fail(_error_text(exc))
    except KeyboardInterrupt:
        pass


def main() -> None:
    app()
