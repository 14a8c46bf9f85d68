"""The commands that act on what a crash or a pause left, or stop a run: `recover`, `answer`, `resume`
and `cancel`."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar, cast

import typer
from rich.text import Text

from stepcore.cli.console import (
    DEBUG_VAR,
    EXIT_WAITING,
    CliError,
    JsonOption,
    RunArgument,
    StoreOption,
    echo_json,
    explain,
    fail,
    out,
    resolve_run_id,
    with_run,
    with_store,
)
from stepcore.cli.orphan_watch import resume_orphans
from stepcore.cli.words import answer_text, cancelled_text
from stepcore.store.step_store import StepStore

__all__ = ('answer', 'cancel', 'recover', 'resume')

T = TypeVar('T')


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
    retry: Annotated[
        bool,
        typer.Option(
            '--retry',
            help='Give a dead run (recovery gave up on it: its resumptions kept dying) another chance: it is an '
            'orphan again, for a recovery loop to resume.',
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
        bool,
        typer.Option(
            '--watch',
            help='With --orphans: keep looking for orphans until stopped (SIGTERM or Ctrl-C: what is under way '
            'finishes first).',
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option(min=0.1, help='With --watch: seconds between two looks for orphans.')
    ] = 10.0,
    quiet: Annotated[
        bool, typer.Option('--quiet', help='With --watch: print no status line while nothing happens.')
    ] = False,
) -> None:
    """Explain what a run left behind and how it can be resumed; settle calls you checked by hand.

    With --orphans, resume every orphaned run (its owner gone or its lease expired) that one of the
    --agent agents runs: each is claimed first, so several workers can do it at once safely.

    Exit status 4 when the run waits for a person: deferred calls to answer, or calls to settle by hand.
    """
    from stepcore.cli.ownership_view import ownership_block, read_ownership
    from stepcore.cli.recovery_view import describe_recovery, parse_supplied, recovery_json, resumed_pause
    from stepcore.store.lifecycle import run_status

    if orphans:
        if run_id is not None or supply or mark_checked or rerun or retry:
            fail('--orphans resumes every orphan: give no RUN, --supply, --mark-checked, --rerun or --retry with it')
        if quiet and not watch:
            fail('--quiet goes with --watch: it silences the status lines printed while nothing happens')
        resume_orphans(store, agent_specs or [], watch=watch, interval=interval, as_json=as_json, quiet=quiet)
        return
    if run_id is None:
        fail('name the run to recover (RUN), or pass --orphans to resume every orphaned run')
    if watch or quiet:
        fail(f'{"--watch" if watch else "--quiet"} goes with --orphans: stepcore recover --orphans --watch')
    supplied = [parse_supplied(item) for item in supply or ()]
    offer_force = None if force else '--force'

    async def body(s: StepStore, rid: str) -> tuple[Any, bool]:
        from stepcore.recovery import inspect_recovery
        from stepcore.recovery.by_hand import mark_checked as check
        from stepcore.recovery.by_hand import rerun_call, supply_result
        from stepcore.recovery.dead import retry_run

        if retry:
            await _in_cli_words(retry_run(s, run_id=rid), action='--retry')
        if supplied or mark_checked or rerun:
            await _refuse_cancelled(s, rid)
        for call_id, result in supplied:
            settle = supply_result(s, run_id=rid, tool_call_id=call_id, result=result, force=force)
            await _in_cli_words(settle, action=f'--supply {call_id}', force=offer_force)
        for call_id in mark_checked or ():
            settle = check(s, run_id=rid, tool_call_id=call_id, force=force)
            await _in_cli_words(settle, action=f'--mark-checked {call_id}', force=offer_force)
        for call_id in rerun or ():
            settle = rerun_call(s, run_id=rid, tool_call_id=call_id, force=force)
            await _in_cli_words(settle, action=f'--rerun {call_id}', force=offer_force)
        report = await inspect_recovery(store=s, run_id=rid)
        status = run_status(await s.list_events_page(rid, newest=True, limit=1))
        seen = (report, status, await resumed_pause(s, report.run), await read_ownership(s, rid))
        return seen, await _waits_for_a_person(s, report)

    run_id, ((report, status, resumes, ownership), waits) = with_run(store, run_id, body)
    if as_json:
        echo_json({**recovery_json(report), 'ownership': ownership.as_json()})
    else:
        console = out()
        console.print(describe_recovery(run_id, report, status=status, resumes=resumes))
        block = ownership_block(ownership)
        if block is not None:
            console.print(block)
    if waits:
        raise typer.Exit(EXIT_WAITING)


async def _in_cli_words(step: Awaitable[T], *, action: str, force: str | None = None) -> T:
    """Await `step`; what it raises is told in the command line's words (see `explain`)."""
    try:
        return await step
    except Exception as error:
        if os.environ.get(DEBUG_VAR):
            raise
        raise explain(error, action=action, force=force) from error


async def _refuse_cancelled(store: StepStore, run_id: str) -> None:
    """Refuse to answer or settle a call of a run that was cancelled (its newest continuation, when it was
    resumed), saying so: what else is wrong with the call matters no more."""
    from stepcore.ownership.claims import has_leases
    from stepcore.recovery.chains import continuations

    if not has_leases(store):
        return
    lease = await store.get_lease((await continuations(store, run_id))[-1])
    if lease is not None and lease.cancelled:
        raise CliError(cancelled_text(lease))


async def _waits_for_a_person(store: StepStore, report: Any) -> bool:
    """Whether the run (its newest continuation, when it was resumed) waits for a person: deferred calls
    nobody answered yet, or calls recovery left to settle by hand (`pending`)."""
    from stepcore.ownership.claims import has_leases
    from stepcore.recovery.answers import read_waiting
    from stepcore.store.leases import LeaseState

    run_id = report.resumed_by[-1] if report.resumed_by else report.run_id
    lease = report.lease if not report.resumed_by else (await store.get_lease(run_id) if has_leases(store) else None)
    if lease is not None and lease.state is LeaseState.PENDING:
        return True
    waiting = report.waiting if not report.resumed_by else await read_waiting(store, run_id=run_id)
    return waiting is not None and waiting.resumed_by is None and bool(waiting.unanswered())


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
    failure: Annotated[
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
            ('--fail', failure is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        fail(
            'give exactly one of --approve, --deny, --result JSON or --fail TEXT'
            + (f' (got {", ".join(chosen)})' if chosen else '')
        )
    if args is not None and not approve:
        fail('--args goes with --approve: the arguments an approved call runs with')
    if message is not None and not deny:
        fail('--message goes with --deny: what the model is told of the denial')
    override: dict[str, Any] | None = None
    if args is not None:
        try:
            parsed = json.loads(args)
        except ValueError as exc:
            fail(f'--args {args!r} is not JSON: {exc}; write an object such as {{"name": "guests"}}')
        if not isinstance(parsed, dict):
            fail(f'--args {args!r} is not a JSON object: write the arguments by name, such as {{"name": "guests"}}')
        override = cast(dict[str, Any], parsed)

    async def body(s: StepStore, rid: str) -> Any:
        if approve:
            return await approve_call(s, run_id=rid, tool_call_id=tool_call_id, override_args=override, by=by)
        if deny:
            return await deny_call(s, run_id=rid, tool_call_id=tool_call_id, message=message, by=by)
        if result is not None:
            value = parse_json_or_text(result)
            return await answer_call(s, run_id=rid, tool_call_id=tool_call_id, result=value, by=by)
        assert failure is not None
        return await fail_call(s, run_id=rid, tool_call_id=tool_call_id, message=failure, by=by)

    async def answered(s: StepStore, rid: str) -> tuple[Any, list[str]]:
        from stepcore.recovery.answers import read_waiting

        await _refuse_cancelled(s, rid)  # its pause is behind the cancel: say so, not that it did not pause
        recorded = await body(s, rid)
        waiting = await read_waiting(s, run_id=rid)
        left = [c.tool_call_id for c in waiting.unanswered()] if waiting is not None else []
        return recorded, left

    run_id, (recorded, left) = with_run(store, run_id, answered)
    if as_json:
        echo_json({'run_id': run_id, **recorded.to_json(), 'unanswered': left})
        return
    console = out()
    console.print(Text(f'{run_id} {tool_call_id}: {answer_text(recorded)}'))
    if left:
        console.print(
            Text(f'still waiting for answers: {", ".join(left)} (`stepcore answer {run_id} CALL ...`)'), style='dim'
        )
    else:
        console.print(
            Text(f'every call is answered: resume it with `stepcore resume {run_id} --agent MODULE:ATTR`'), style='dim'
        )


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

    Exit status 0 also when the run had already finished (nothing to resume), 3 when another process
    holds or claimed the run, 4 when it waits for a person (calls to answer or to settle by hand).
    """
    from stepcore.cli.agent_stores import check_agent_stores, load_agents
    from stepcore.recovery.resolution import resolve_run

    loaded = load_agents(store, [agent_spec])
    agent = loaded[0][1]

    async def body(s: StepStore) -> tuple[str, tuple[Any, Any]]:
        # the stores first: in another store than the agent's, the run is not the one to look for
        await check_agent_stores(s, loaded, action=f'resume run {run_id}')
        rid = await resolve_run_id(s, run_id)
        offer_force = None if force else '--force'
        resumption = await _in_cli_words(
            resolve_run(s, run_id=rid, agent=agent, force=force), action='resuming it', force=offer_force
        )
        if not resumption.ready:
            return rid, (resumption, None)
        return rid, (resumption, await _in_cli_words(resumption.run(agent), action='resuming it'))

    run_id, (resumption, outcome) = with_store(store, body)
    if outcome is None:
        _not_resumed(run_id, resumption, agent_spec, as_json=as_json)
        return
    output = outcome.output
    shown = output if isinstance(output, str | int | float | bool | None) else repr(output)
    if as_json:
        echo_json({'run_id': run_id, 'resumed_as': outcome.run_id, 'output': shown})
        return
    out().print(Text.assemble((f'{run_id}: ', 'bold'), ('resumed', 'green'), f' as {outcome.run_id}'))
    out().print(Text(str(shown)))


def _not_resumed(run_id: str, resumption: Any, agent_spec: str, *, as_json: bool) -> None:
    """Say why `stepcore resume` resumed nothing: the run already finished (exit 0), or it waits for a
    person (exit 4): deferred calls to answer, or calls a crash cut short to settle by hand."""
    newest = resumption.run_id
    again = f'`stepcore resume {run_id} --agent {agent_spec}`'
    if resumption.finished:
        if as_json:
            echo_json({'run_id': run_id, 'resumed_as': None, 'output': None, 'finished': True, 'newest_run': newest})
            return
        if newest == run_id:
            said = f'run {run_id} already finished: there is nothing to resume'
        else:
            said = (
                f'run {run_id} was resumed already, by run {newest}, which already ended with a final response: '
                'there is nothing to resume'
            )
        out().print(Text(said))
        return
    waiting = [{'tool_call_id': c.tool_call_id, 'tool_name': c.tool_name, 'kind': c.kind} for c in resumption.waiting]
    pending = [{'tool_call_id': e.tool_call_id, 'tool_name': e.tool_name, 'args': e.args} for e in resumption.pending]
    if as_json:
        echo_json({'run_id': run_id, 'resumed_as': None, 'output': None, 'waiting': waiting, 'pending': pending})
        raise typer.Exit(EXIT_WAITING)
    console = out()
    if waiting:
        calls = ', '.join(f'{c["tool_name"]} ({c["tool_call_id"]}, {c["kind"]})' for c in waiting)
        console.print(
            Text(
                f'run {run_id} waits for answers to deferred tool calls: {calls}. Answer each with '
                f'`stepcore answer {run_id} CALL --approve` (or --deny, --result JSON, --fail TEXT), then run '
                f'{again} again.'
            )
        )
    if pending:
        calls = ', '.join(f'{e["tool_name"]} ({e["tool_call_id"]}) args {_json_text(e["args"])}' for e in pending)
        console.print(
            Text(
                f'run {newest} has tool calls a crash cut short that nobody settled yet: {calls}. Check each '
                f'outside the agent, then settle it with `stepcore recover {run_id} --supply CALL=RESULT`, '
                f'`--mark-checked CALL` (it happened) or `--rerun CALL` (it did not), and run {again} again.'
            )
        )
    raise typer.Exit(EXIT_WAITING)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(', ', ': '), default=str)


def cancel(
    run_id: RunArgument,
    reason: Annotated[
        str,
        typer.Option(
            '--reason', metavar='TEXT', help='Why the run is stopped (recorded, and shown to whoever reads it).'
        ),
    ],
    by: Annotated[
        str | None,
        typer.Option('--by', metavar='WHO', help='Who cancels it (recorded; default: this host and process).'),
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Stop a run for good: it never resumes.

    A run that is running is stopped at its next write to the store (its process is refused); an
    orphan, a run waiting for answers or one left for a person ends at once. The run's lease says
    who cancelled it and why, and so does a `run_failed` event. Cancelling it twice changes nothing.
    A run that already finished is left as it is.
    """
    from stepcore.recovery.cancel import cancel_run

    async def body(s: StepStore, rid: str) -> Any:
        return await cancel_run(s, run_id=rid, reason=reason, by=by)

    run_id, lease = with_run(store, run_id, body)
    if as_json:
        echo_json({'run_id': lease.run_id, 'state': lease.state.value, 'outcome': lease.outcome, 'note': lease.note})
        return
    which = f'run {lease.run_id}' + (f' (the newest continuation of {run_id})' if lease.run_id != run_id else '')
    out().print(Text(f'{which} is {lease.note}'))
