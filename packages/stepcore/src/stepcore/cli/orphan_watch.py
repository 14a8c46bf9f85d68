"""`stepcore recover --orphans`: resume every orphaned run this worker has an agent for, once, or with
`--watch` until a signal stops it (what is under way finishes first), each outcome told in the command
line's words."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import Callable
from typing import Any

import typer
from rich.text import Text

from stepcore.cli.console import EXIT_FAILED, EXIT_OK, EXIT_WAITING, CliError, err, error_text, fail, out, with_store
from stepcore.cli.words import in_cli_terms, strip_error_class
from stepcore.store.step_store import StepStore

__all__ = ('resume_orphans',)


def resume_orphans(
    url: str | None, specs: list[str], *, watch: bool, interval: float, as_json: bool, quiet: bool
) -> None:
    """Resume the orphans of the store at `url` that the agents `specs` name run, once or (`watch`) until stopped;
    exit status 4 when one was left for a person, 1 when one could not be resumed."""
    from stepcore.cli.agent_stores import check_agent_stores, load_agents
    from stepcore.recovery.fleet import OrphanOutcome, recover_orphans

    if not specs:
        fail('--orphans needs the agents that run them: pass --agent MODULE:ATTR (repeatable)')
    loaded = load_agents(url, specs)
    agents = [agent for _, agent in loaded]

    def show(outcome: OrphanOutcome) -> None:
        if as_json:
            typer.echo(json.dumps(_outcome_json(outcome)))
            return
        style = {'resumed': 'green', 'failed': 'red', 'dead': 'red', 'pending': 'yellow', 'abandoned': 'yellow'}
        out().print(
            Text.assemble(
                (f'{outcome.run_id}: ', 'bold'),
                (outcome.outcome, style.get(outcome.outcome, '')),
                _outcome_detail(outcome),
            ),
            soft_wrap=True,
        )

    async def body(s: StepStore) -> int:
        await check_agent_stores(s, loaded, action='resume the orphaned runs of this store')
        if watch:
            return await _watch(s, url, agents, interval=interval, show=show, quiet=quiet)
        outcomes = await recover_orphans(s, agents)
        for outcome in outcomes:
            show(outcome)
        if not outcomes and not as_json:
            out().print('no orphaned runs')
        failed = [o.run_id for o in outcomes if o.outcome in ('failed', 'dead')]
        if failed:
            raise CliError(
                f'{len(failed)} of {len(outcomes)} orphans could not be resumed ({", ".join(failed)}): see '
                '`stepcore recover RUN` for each'
            )
        return EXIT_WAITING if any(o.outcome == 'pending' for o in outcomes) else EXIT_OK

    code = with_store(url, body)
    if code:
        raise typer.Exit(code)


_LEFT_FOR_OTHERS = ('unknown agent', 'other version')
"""Outcomes of an orphan this worker leaves for another: `--watch` reports each once, not at every look."""


async def _watch(
    store: StepStore,
    url: str | None,
    agents: list[Any],
    *,
    interval: float,
    show: Callable[[Any], None],
    quiet: bool,
) -> int:
    """Run the recovery loop until SIGTERM or SIGINT: then claim nothing more, let what is under way finish,
    and answer 0; a second signal cancels what is under way (its runs are orphans again once their
    leases expire) and answers 1. A status line goes to stderr when a look found nothing to report."""
    from stepcore.cli.stores import resolve_store_url
    from stepcore.recovery.fleet import OrphanOutcome, run_recovery_loop

    where = _shown_url(resolve_store_url(url))
    stop = asyncio.Event()
    stopping: list[str] = []
    reported = False
    left: dict[str, str] = {}

    def say(text: str) -> None:
        err().print(Text(text), soft_wrap=True, highlight=False)

    def on_outcome(outcome: OrphanOutcome) -> None:
        nonlocal reported
        if outcome.outcome in _LEFT_FOR_OTHERS:
            if left.get(outcome.run_id) == outcome.outcome:
                return
            left[outcome.run_id] = outcome.outcome
        else:
            left.pop(outcome.run_id, None)
        reported = True
        show(outcome)

    recovery = asyncio.create_task(
        run_recovery_loop(store, agents, interval=interval, stop=stop, on_outcome=on_outcome),
        name='stepcore recover --orphans --watch',
    )

    def on_signal(name: str) -> None:
        stopping.append(name)
        if len(stopping) == 1:
            say(
                f'{name}: stopping: no more runs are claimed, and the resumptions under way finish first '
                f'({name} again stops at once)'
            )
            stop.set()
        else:
            say(f'{name} again: stopping at once')
            recovery.cancel()

    async def idle() -> None:
        nonlocal reported
        while not stop.is_set():
            await asyncio.sleep(interval)
            if reported or stop.is_set() or quiet:
                reported = False
                continue
            say(f'watching {where}: {await _standing_counts(store)}, next look within {interval:g} s')

    names = ', '.join(sorted({getattr(a, 'name', None) or '?' for a in agents}))
    restore = _on_signals(on_signal)
    ticker = asyncio.create_task(idle(), name='stepcore recover --watch status')
    try:
        say(f'watching {where} for orphans of {names} every {interval:g} s; SIGTERM or Ctrl-C stops it')
        await recovery
    except asyncio.CancelledError:
        if len(stopping) < 2:
            raise
        say(
            'stopped at once: the resumptions under way were cancelled; their runs are orphans again once their '
            'leases expire'
        )
        return EXIT_FAILED
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        restore()
    say(
        f'stopped on {stopping[0]}: every resumption under way finished; this worker holds no run'
        if stopping
        else 'stopped'
    )
    return EXIT_OK


async def _standing_counts(store: StepStore) -> str:
    """`N orphans, M waiting` for the status line, and `K resuming here` while this process holds runs (or
    why the store could not tell)."""
    from stepcore.ownership.claims import has_leases
    from stepcore.ownership.identity import same_process
    from stepcore.ownership.orphans import list_orphans
    from stepcore.recovery.answers import list_waiting
    from stepcore.store.leases import LeaseState

    try:
        orphans = len(await list_orphans(store))
        here = 0
        if has_leases(store):
            waiting = len(await store.list_leases([LeaseState.WAITING]))
            here = sum(same_process(lease.owner) for lease in await store.list_leases([LeaseState.RUNNING]))
        else:
            waiting = len(await list_waiting(store))
    except Exception as error:
        return f'the store did not answer ({error_text(error)})'
    resuming = f', {here} resuming here' if here else ''
    return f'{orphans} orphan{"" if orphans == 1 else "s"}, {waiting} waiting{resuming}'


def _on_signals(handler: Callable[[str], None]) -> Callable[[], None]:
    """Call `handler(name)` on SIGTERM and SIGINT instead of stopping the process; answers what restores
    the handlers there were. Where signals cannot be caught (not the main thread), nothing changes."""
    loop = asyncio.get_running_loop()
    caught: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, handler, sig.name)
        except (NotImplementedError, RuntimeError, ValueError):
            continue
        caught.append(sig)

    def restore() -> None:
        for sig in caught:
            loop.remove_signal_handler(sig)

    return restore


def _shown_url(url: str) -> str:
    """The store URL with its password, if any, left out."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if not parts.password:
            return url
    except ValueError:
        return url
    user, _, host = parts.netloc.rpartition('@')
    return urlunsplit(parts._replace(netloc=f'{user.split(":", 1)[0]}:***@{host}'))


def _outcome_detail(outcome: Any) -> str:
    """What follows `RUN: OUTCOME` in an outcome line, in the command line's words."""
    raw: str = outcome.detail or ''
    run_id = outcome.run_id
    if outcome.outcome == 'resumed':  # the detail is the agent's output, shown as it is
        return f' as {outcome.resumed_as}, {raw}' if outcome.resumed_as else (f', {raw}' if raw else '')
    detail = in_cli_terms(strip_error_class(raw) if outcome.outcome in ('failed', 'busy') else raw)
    if outcome.outcome == 'pending':
        calls, _, rest = detail.removeprefix('settle by hand: ').partition(';')
        bare = re.search(r'so a person decides: ([^(;]+)', rest)
        without = f'; tools without a recovery policy: {bare[1].strip()}' if bare else ''
        return (
            f': waits for a person to settle {calls.strip()}{without}. Check each call outside the agent, then '
            f'`stepcore recover {run_id} --supply CALL=RESULT`, `--mark-checked CALL` or `--rerun CALL`'
        )
    if outcome.outcome == 'unknown agent':
        return f': {detail}; left for a worker that runs it (pass its --agent)'
    return f': {detail}' if detail else ''


def _outcome_json(outcome: Any) -> dict[str, Any]:
    return {
        'run_id': outcome.run_id,
        'outcome': outcome.outcome,
        'detail': outcome.detail,
        'resumed_as': outcome.resumed_as,
    }
