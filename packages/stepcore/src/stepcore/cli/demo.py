"""`stepcore demo`: a run killed mid tool call, inspected, and resumed with its cut-short call reconciled."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.rule import Rule

from stepcore.cli._loop import run_coroutine
from stepcore.cli.demo_agents import (
    CONVERSATION_ID,
    FIRST_RUN_ID,
    OUTBOX_FILE,
    REPORT_FILE,
    RESUMED_RUN_ID,
    build_agents,
)
from stepcore.cli.demo_chart import CHART_FILE
from stepcore.cli.recovery_view import describe_recovery
from stepcore.cli.run_tree import RunNode, run_tree
from stepcore.cli.tables import effects_table, events_table, run_status, runs_table, snapshots_table
from stepcore.cli.transcript import render_messages
from stepcore.plugins.registry import get_registry, store_from_spec
from stepcore.recovery.inspection import inspect_recovery
from stepcore.recovery.resolution import resolve_run
from stepcore.store.step_store import StepStore

__all__ = ('DemoError', 'run_demo')

_MARKER = '.send_email.started'
_DEMO_FILES = {REPORT_FILE, CHART_FILE, OUTBOX_FILE, _MARKER}
_WORKER_TIMEOUT = 120.0


class DemoError(Exception):
    """The demo could not run; the message says why and what to do."""


def _workdir_for(database: Path) -> Path:
    return database.with_name(database.stem + '-files')


def _reset(database: Path, workdir: Path) -> None:
    """Start fresh: remove an earlier demo database and its files, refusing to touch anything else."""
    if database.exists():
        if database.is_dir():
            raise DemoError(f'{str(database)!r} is a folder: pass --database a file path')
        with database.open('rb') as f:
            header = f.read(16)
        if header and header != b'SQLite format 3\x00':
            raise DemoError(f'{str(database)!r} exists and is not a SQLite database: pass --database a new file path')
    for suffix in ('', '-wal', '-shm', '-journal'):
        Path(str(database) + suffix).unlink(missing_ok=True)
    if workdir.exists():
        unknown = sorted(p.name for p in workdir.iterdir() if p.name not in _DEMO_FILES)
        if unknown:
            raise DemoError(f'{str(workdir)!r} holds files the demo did not write ({", ".join(unknown)}): move them')
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)


def _open_store(database: Path) -> StepStore:
    try:
        return cast(StepStore, store_from_spec('sqlite', database=database))
    except ValueError as exc:
        raise DemoError(f'the demo stores runs in SQLite: {exc}') from None


def _run_worker(database: Path, workdir: Path, console: Console) -> None:
    marker = workdir / _MARKER
    command = [
        sys.executable,
        '-m',
        'stepcore.cli.demo_worker',
        '--database',
        str(database),
        '--workdir',
        str(workdir),
        '--marker',
        str(marker),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + _WORKER_TIMEOUT
    while not marker.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise DemoError(
                f'the agent process exited with code {proc.returncode} before reaching send_email:\n{out}{err}'
            )
        if time.monotonic() > deadline:
            proc.kill()
            proc.communicate()
            raise DemoError(f'the agent process did not reach send_email within {_WORKER_TIMEOUT:.0f} s')
        time.sleep(0.02)
    proc.kill()  # SIGKILL: no exception handler, finally block or hook gets to run
    out, _err = proc.communicate()
    for line in out.splitlines():
        console.print(f'  [dim]child |[/] {escape(line)}', highlight=False, soft_wrap=True)
    console.print(f'  [bold red]parent: sent SIGKILL to the child (exit code {proc.returncode})[/]', highlight=False)


def _stage(console: Console, number: int, title: str, note: str) -> None:
    console.print()
    console.print(Rule(f'[bold]{number}. {title}[/]', align='left'))
    console.print(note, highlight=False)


async def _inspect_and_resume(database: Path, workdir: Path, console: Console, *, resume: bool) -> None:
    store = _open_store(database)
    try:
        await _inspect(store, workdir, console)
        if resume:
            await _resume(store, workdir, console)
    finally:
        await store.aclose()


async def _tree(store: StepStore, run_id: str) -> RunNode:
    record = await store.get_run(run_id=run_id)
    assert record is not None
    children = [await _tree(store, child.run_id) for child in await store.list_runs(parent_run_id=run_id)]
    status = run_status(await store.list_events(run_id=run_id))
    unresolved = len(await store.list_unresolved_tool_effects(run_id=run_id))
    return RunNode(record, status, unresolved, children)


async def _inspect(store: StepStore, workdir: Path, console: Console) -> None:
    _stage(
        console,
        2,
        'The run tree',
        'The assistant delegated to a researcher; the delegate run points at it through parent_run_id. '
        'The assistant never finished: its process died.',
    )
    console.print(Padding(run_tree(await _tree(store, FIRST_RUN_ID)), (0, 2), expand=False))

    _stage(
        console,
        3,
        'The event trail',
        'Events are appended as the run goes, so the trail ends where the process died: a tool call '
        'that started and never completed.',
    )
    events = await store.list_events(run_id=FIRST_RUN_ID)
    console.print(events_table(events, timestamps=False, width=console.width))

    _stage(
        console,
        4,
        'Snapshots',
        'A complete snapshot is saved each time a round of tool calls has settled; it is a safe point '
        'to continue from.',
    )
    snapshots = await store.list_snapshots(run_id=FIRST_RUN_ID, include_interrupted=True)
    console.print(snapshots_table(snapshots, timestamps=False, width=console.width))

    _stage(
        console,
        5,
        'The tool-effect ledger',
        'send_email is still "started": the ledger cannot tell whether the email went out. The tool '
        'recorded an idempotency key before acting, and its recovery policy can ask the outbox.',
    )
    effects = await store.list_tool_effects(run_id=FIRST_RUN_ID)
    console.print(effects_table(effects, timestamps=False, compact=True, width=console.width))
    outbox = workdir / OUTBOX_FILE
    sent = len(outbox.read_text(encoding='utf-8').splitlines()) if outbox.exists() else 0
    console.print(f'Outbox on disk: {sent} email(s) sent. {REPORT_FILE} exists: {(workdir / REPORT_FILE).exists()}.')

    _stage(console, 6, 'What inspect_recovery says', 'The same report `stepcore recover` prints:')
    report = await inspect_recovery(store=store, run_id=FIRST_RUN_ID)
    console.print(Padding(describe_recovery(FIRST_RUN_ID, report, owners=False), (0, 2), expand=False))


async def _resume(store: StepStore, workdir: Path, console: Console) -> None:
    settled = await store.latest_snapshot(run_id=FIRST_RUN_ID)
    assert settled is not None

    def say(line: str) -> None:
        console.print(f'  [dim]resumed |[/] {escape(line)}', highlight=False, soft_wrap=True)

    agents = build_agents(store, workdir, say=say)
    _stage(
        console,
        7,
        'Resume',
        f'resolve_run takes the settled snapshot (seq {settled.seq}, ending with the write_report result) and '
        'settles the cut-short send_email by its recovery policy: a reconcile function that looks in the outbox. '
        f'A new run, {RESUMED_RUN_ID}, in the same conversation, carries on with that result: research, the '
        'report and the email are not redone.',
    )
    resumption = await resolve_run(store, run_id=FIRST_RUN_ID, agent=agents.assistant)
    for settled_call in resumption.settled:
        console.print(
            f'  {escape(settled_call.tool_name)} ({escape(settled_call.tool_call_id)}) settled: '
            f'{settled_call.how}, result {escape(repr(settled_call.result))}',
            highlight=False,
        )
    console.print(Padding(render_messages(resumption.message_history), (0, 2), expand=False))
    result = await resumption.run(agents.assistant, run_id=RESUMED_RUN_ID, conversation_id=CONVERSATION_ID)
    console.print(f'  [bold]assistant:[/] {escape(result.output)}', highlight=False)

    _stage(console, 8, 'The conversation now', 'Both runs share the conversation id; the second one completed.')
    runs = await store.list_runs(conversation_id=CONVERSATION_ID)
    statuses = [run_status(await store.list_events(run_id=r.run_id)) for r in runs]
    console.print(runs_table(runs, statuses, timestamps=False, width=console.width))
    unresolved = len(await store.list_unresolved_tool_effects(run_id=FIRST_RUN_ID))
    unresolved += len(await store.list_unresolved_tool_effects(run_id=RESUMED_RUN_ID))
    outbox = workdir / OUTBOX_FILE
    sent = len(outbox.read_text(encoding='utf-8').splitlines()) if outbox.exists() else 0
    console.print(f'Unresolved tool calls in either run: {unresolved}. Outbox: {sent} email(s) sent.')


def run_demo(database: Path, *, console: Console, resume: bool = True) -> None:
    """Run the whole demo, printing each stage to `console` (with `resume=False`, stop before resuming)."""
    database = database.expanduser()
    workdir = _workdir_for(database)
    try:
        get_registry().get('step', 'sqlite')
    except ValueError as exc:
        raise DemoError(f'the demo stores runs in SQLite: {exc}') from None
    _reset(database, workdir)
    console.print(
        '[bold]stepcore demo[/]: an assistant agent researches (through a delegate agent), writes a report '
        'and emails it. Its process is killed in the middle of sending the email. Then we look at what '
        'was saved and resume the run.',
        highlight=False,
    )
    console.print(f'Database: {escape(str(database))}   Files: {escape(str(workdir))}', highlight=False)

    _stage(
        console,
        1,
        'Run the agent in a child process, then kill it',
        f'The child runs {FIRST_RUN_ID} with StepPersistence writing to SQLite. When send_email starts, '
        'the child signals the parent, which kills it with SIGKILL.',
    )
    _run_worker(database, workdir, console)
    run_coroutine(_inspect_and_resume(database, workdir, console, resume=resume))

    store_url = f'sqlite:///{database}'
    console.print()
    console.print(Rule('[bold]Explore it yourself[/]', align='left'))
    for command in (
        f'stepcore runs --store {store_url}',
        f'stepcore tree {FIRST_RUN_ID} --store {store_url}',
        f'stepcore show {FIRST_RUN_ID} --store {store_url}',
        f'stepcore effects {FIRST_RUN_ID} --store {store_url}',
        f'stepcore export {FIRST_RUN_ID} --with-delegates --store {store_url} -o report-run-1.json',
    ):
        console.print(f'  {escape(command)}', highlight=False, soft_wrap=True)
    console.print(
        'Or browse the same database in a web page: the run tree, the timeline, the ledger with the '
        'reconciled send_email, and each snapshot as a conversation, chart included '
        + escape('(needs the ui extra: pip install "stepcore[ui]"):'),
        highlight=False,
    )
    console.print(f'  {escape(f"stepcore ui --store {store_url} --open")}', highlight=False, soft_wrap=True)
