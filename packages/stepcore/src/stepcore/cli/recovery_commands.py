"""The commands that act on what a crash or a pause left, or stop a run: `recover`, `answer`, `resume`
and `cancel`."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any, cast

import typer
from rich.text import Text

from stepcore.cli.console import JsonOption, RunArgument, StoreOption, echo_json, fail, out, with_run, with_store
from stepcore.store.step_store import StepStore

__all__ = ('answer', 'cancel', 'recover', 'resume')


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
        if run_id is not None or supply or mark_checked or rerun or retry:
            fail('--orphans resumes every orphan: give no RUN, --supply, --mark-checked, --rerun or --retry with it')
        _recover_orphans(store, agent_specs or [], watch=watch, interval=interval, as_json=as_json)
        return
    if run_id is None:
        fail('name the run to recover (RUN), or pass --orphans to resume every orphaned run')
    supplied = [parse_supplied(item) for item in supply or ()]

    async def body(s: StepStore, rid: str) -> Any:
        from stepcore.recovery import inspect_recovery
        from stepcore.recovery.dead import retry_run
        from stepcore.recovery.resolution import mark_checked as check
        from stepcore.recovery.resolution import rerun_call, supply_result

        if retry:
            await retry_run(s, run_id=rid)
        for call_id, result in supplied:
            await supply_result(s, run_id=rid, tool_call_id=call_id, result=result, force=force)
        for call_id in mark_checked or ():
            await check(s, run_id=rid, tool_call_id=call_id, force=force)
        for call_id in rerun or ():
            await rerun_call(s, run_id=rid, tool_call_id=call_id, force=force)
        return await inspect_recovery(store=s, run_id=rid)

    run_id, report = with_run(store, run_id, body)
    if as_json:
        echo_json(recovery_json(report))
        return
    out().print(describe_recovery(run_id, report))


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

    run_id, recorded = with_run(store, run_id, body)
    if as_json:
        echo_json({'run_id': run_id, **recorded.to_json()})
        return
    out().print(Text(f'{run_id} {tool_call_id}: {recorded.describe()}'))


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
        fail(str(exc.message))

    async def body(s: StepStore, rid: str) -> Any:
        return await resume_run(s, run_id=rid, agent=agent, force=force)

    run_id, outcome = with_run(store, run_id, body)
    output = outcome.output
    shown = output if isinstance(output, str | int | float | bool | None) else repr(output)
    if as_json:
        echo_json({'run_id': run_id, 'resumed_as': outcome.run_id, 'output': shown})
        return
    out().print(Text.assemble((f'{run_id}: ', 'bold'), ('resumed', 'green'), f' as {outcome.run_id}'))
    out().print(Text(str(shown)))


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
        fail('--orphans needs the agents that run them: pass --agent MODULE:ATTR (repeatable)')
    try:
        agents = [_load_agent(spec) for spec in specs]
    except typer.BadParameter as exc:
        fail(str(exc.message))

    def show(outcome: OrphanOutcome) -> None:
        if as_json:
            typer.echo(json.dumps(_outcome_json(outcome)))
        else:
            style = {'resumed': 'green', 'failed': 'red', 'pending': 'yellow', 'abandoned': 'yellow'}
            out().print(
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
            out().print('no orphaned runs')
        return sum(o.outcome == 'failed' for o in outcomes)

    failed = with_store(url, body)
    if failed:
        raise typer.Exit(1)


def _outcome_json(outcome: Any) -> dict[str, Any]:
    return {
        'run_id': outcome.run_id,
        'outcome': outcome.outcome,
        'detail': outcome.detail,
        'resumed_as': outcome.resumed_as,
    }


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
