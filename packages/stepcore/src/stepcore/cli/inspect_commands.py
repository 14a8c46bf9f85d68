"""The commands that read a store's runs: `runs`, `job`, `tree`, `events`, `snapshots`, `show` and `effects`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, cast

import typer
from rich.console import Group
from rich.text import Text

from stepcore.cli.console import JsonOption, RunArgument, StoreOption, echo_json, fail, out, with_run, with_store
from stepcore.cli.lease_json import job_table, lease_json
from stepcore.cli.run_tree import RunNode, run_tree
from stepcore.cli.tables import Waits, effects_table, events_table, runs_table, snapshots_table, standing_label
from stepcore.cli.transcript import render_messages
from stepcore.cli.words import died_text
from stepcore.ownership.claims import has_leases, live, read_lease
from stepcore.recovery.standing import (
    LEASE_STATUSES,
    Standing,
    record_matches,
    runs_by_lease,
    standing_of,
    standings_of,
)
from stepcore.store.codec import dump_record
from stepcore.store.lifecycle import RunStatus, parse_duration
from stepcore.store.models import StepEvent, utcnow
from stepcore.store.step_store import StepStore
from stepcore.store.waiting import answer_of

__all__ = ('effects', 'events', 'job', 'runs', 'show', 'snapshots', 'tree')


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
            fail(
                f'{option} {value!r} is neither a date nor an age: give an ISO date or date-time '
                '(2026-11-30, 2026-11-30T08:00:00+01:00) or an age such as 7d, 12h or 90m'
            )
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def runs(
    store: StoreOption = None,
    conversation: Annotated[str | None, typer.Option(help='Only runs of this conversation_id.')] = None,
    parent: Annotated[str | None, typer.Option(help='Only runs delegated from this run id.')] = None,
    agent: Annotated[str | None, typer.Option(help='Only runs of this agent name.')] = None,
    job: Annotated[
        str | None, typer.Option(metavar='ID', help='Only the runs of this job (its first run and its resumptions).')
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(
            metavar='STATUS',
            help='Only runs with this status: completed, failed, unfinished or waiting (paused on deferred tool '
            'calls, not resumed yet); or, from their leases: running, orphaned, pending, resumed or dead.',
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

    async def body(s: StepStore) -> tuple[list[Any], list[Standing], bool, list[Waits | None] | None]:
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
            if job is not None:
                chain = {r.run_id for r in await _job_records(s, job)}
                found = [r for r in found if r.run_id in chain]
        elif job is not None:
            found = [r for r in await _job_records(s, job, status) if record_matches(r, **options)]
        else:
            found = await s.list_runs(
                **options, status=cast(RunStatus | None, status), limit=offset + limit + 1, newest_first=True
            )
        page = found[offset : offset + limit][::-1]
        waits = [await _waits(s, r.run_id) for r in page] if status == 'waiting' else None
        return page, await standings_of(s, [r.run_id for r in page]), len(found) > offset + limit, waits

    page, standings, more, waits = with_store(store, body)
    if as_json:
        rows: list[dict[str, Any]] = []
        for index, (record, standing) in enumerate(zip(page, standings, strict=True)):
            row = {**dump_record(record), 'status': standing.status, 'ownership': standing.ownership}
            row['standing'] = standing.label
            if waits is not None:
                row.update(_waits_json(waits[index]))
            rows.append(row)
        echo_json(rows)
        return
    if not page:
        filtered = any(v is not None for v in (conversation, parent, agent, job, status, after, before)) or offset
        out().print('no runs match' if filtered else 'no runs in this store')
        return
    console = out()
    labels = [standing_label(st) for st in standings]
    console.print(runs_table(page, labels, waits=waits, width=console.width))
    if more or offset:
        hint = f'; use --offset {offset + len(page)} for older ones' if more else ''
        console.print(f'newest runs {offset + 1}-{offset + len(page)} shown (oldest first){hint}', style='dim')


async def _waits(store: StepStore, run_id: str) -> Waits | None:
    """What a waiting run waits for: its unanswered calls and their earliest deadline (`None`: it did not
    pause on deferred tool calls)."""
    from stepcore.recovery.answers import read_waiting

    waiting = await read_waiting(store, run_id=run_id)
    if waiting is None:
        return None
    unanswered = waiting.unanswered(utcnow())
    deadlines = [call.deadline for call in unanswered if call.deadline is not None]
    return Waits(len(unanswered), len(waiting.calls), min(deadlines) if deadlines else None)


def _waits_json(waits: Waits | None) -> dict[str, Any]:
    if waits is None:
        return {'waiting_calls': None, 'unanswered_calls': None, 'next_deadline': None}
    deadline = waits.deadline.isoformat() if waits.deadline is not None else None
    return {'waiting_calls': waits.calls, 'unanswered_calls': waits.unanswered, 'next_deadline': deadline}


def tree(run_id: RunArgument, store: StoreOption = None, as_json: JsonOption = False) -> None:
    """Show a run and the runs delegated from it, with their status."""

    async def build(s: StepStore, rid: str, seen: set[str]) -> RunNode:
        record = await s.get_run(run_id=rid)
        if record is None:
            raise LookupError(f'run {rid!r} not found in this store: list the stored runs with `stepcore runs`')
        seen.add(rid)
        standing = await standing_of(s, rid)
        unresolved = len(await s.list_unresolved_tool_effects(run_id=rid))
        children = [
            await build(s, child.run_id, seen)
            for child in await s.list_runs(parent_run_id=rid)
            if child.run_id not in seen
        ]
        return RunNode(
            record,
            standing.status,
            unresolved,
            children,
            running=standing.ownership == 'running',
            resumed_by=standing.resumed_by[0] if standing.resumed_by else None,
        )

    _, root = with_run(store, run_id, lambda s, rid: build(s, rid, set()))
    if as_json:
        echo_json(root.as_json())
        return
    out().print(run_tree(root))


def events(run_id: RunArgument, store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List a run's step events in the order they were appended.

    An answer to a deferred tool call is listed as `call_answered`, with the answer: approved (maybe
    with other arguments), denied, a result from outside, failed, or expired, and who gave it.
    """

    from stepcore.cli.ownership_view import ownership_block, read_ownership

    async def body(s: StepStore, rid: str) -> tuple[list[Any], Any]:
        found = await s.list_events(run_id=rid)
        return found, None if as_json else await read_ownership(s, rid)

    run_id, (found, ownership) = with_run(store, run_id, body)
    if as_json:
        echo_json([_event_json(e) for e in found])
        return
    console = out()
    console.print(events_table(found, title=f'events of {run_id}', width=console.width))
    block = ownership_block(ownership)
    if block is not None:
        console.print(block)


def _event_json(event: StepEvent) -> dict[str, Any]:
    """An event as stored (its `kind` too), and `answer`: the answer it records to a deferred tool call
    (`decision`, `by`, `at`, `override_args`, `message`, `result`), or `null`."""
    answer = answer_of(event)
    return {**dump_record(event), 'answer': None if answer is None else answer.to_json()}


def snapshots(run_id: RunArgument, store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List a run's retained snapshots (see `show` for their messages)."""

    async def body(s: StepStore, rid: str) -> list[Any]:
        return await s.list_snapshots(run_id=rid, include_interrupted=True)

    run_id, found = with_run(store, run_id, body)
    if as_json:
        echo_json([{**dump_record(x, exclude={'messages'}), 'message_count': len(x.messages)} for x in found])
        return
    if not found:
        out().print(Text(f'run {run_id} has no snapshots'))
        return
    console = out()
    console.print(snapshots_table(found, title=f'snapshots of {run_id}', width=console.width))


def show(
    run_id: RunArgument,
    seq: Annotated[int | None, typer.Option(help='Show this snapshot instead of the newest one.')] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the messages of a run's newest snapshot (of any state), or of snapshot --seq N.

    For a run that paused on deferred tool calls, or resumed one that did, the answers follow: who
    answered each call, when, and how.
    """
    from stepcore.cli.ownership_view import Ownership, ownership_block, read_ownership
    from stepcore.cli.recovery_view import describe_answers, resumed_pause
    from stepcore.cli.transfer import _dump_snapshot  # pyright: ignore[reportPrivateUsage]
    from stepcore.recovery.answers import read_waiting

    async def snapshot(s: StepStore, rid: str) -> Any:
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

    async def body(s: StepStore, rid: str) -> tuple[Any, Any, Any, Ownership]:
        snap = await snapshot(s, rid)
        ownership = await read_ownership(s, rid)
        if as_json:
            return snap, None, None, ownership
        waiting = await read_waiting(s, run_id=rid)
        return snap, waiting, await resumed_pause(s, await s.get_run(run_id=rid)), ownership

    run_id, (snap, waiting, resumes, ownership) = with_run(store, run_id, body)
    if as_json:
        echo_json({**_dump_snapshot(snap), 'ownership': ownership.as_json()})
        return
    header = Text()
    header.append(f'{run_id}', style='bold')
    header.append(f'  snapshot seq {snap.seq}, step {snap.step_index}, ')
    newest = waiting is not None and waiting.snapshot is not None and waiting.snapshot.seq == snap.seq
    if newest and snap.state.value == 'interrupted':  # a paused history holds its deferred calls open by design
        header.append('paused: its deferred tool calls open', style='cyan')
    else:
        header.append(snap.state.value, style='green' if snap.state.value == 'complete' else 'yellow')
    header.append(f', {len(snap.messages)} messages')
    console = out()
    console.print(header)
    console.print(render_messages(snap.messages))
    if resumes is not None:
        console.print(Group(*describe_answers(resumes, resumed_here=True)))
    if waiting is not None:
        console.print(Group(*describe_answers(waiting)))
    block = ownership_block(ownership)
    if block is not None:
        console.print(block)


def effects(
    run_id: RunArgument,
    unresolved: Annotated[bool, typer.Option('--unresolved', help='Only calls started with no outcome.')] = False,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """List a run's tool-effect ledger: which tool calls completed, failed, or may or may not have run."""

    async def body(s: StepStore, rid: str) -> tuple[list[Any], bool]:
        found = await (s.list_unresolved_tool_effects(run_id=rid) if unresolved else s.list_tool_effects(run_id=rid))
        return found, live(await read_lease(s, rid))

    run_id, (found, running) = with_run(store, run_id, body)
    if as_json:
        echo_json([dump_record(e) for e in found])
        return
    if not found:
        out().print(Text(f'run {run_id} has no {"unresolved " if unresolved else ""}tool effects'))
        return
    console = out()
    console.print(effects_table(found, title=f'tool effects of {run_id}', width=console.width))
    started = sum(e.unresolved for e in found)
    if running and started:
        console.print(
            Text(
                f'run {run_id} is running: {"its call" if started == 1 else f"its {started} calls"} still started '
                f'{"is" if started == 1 else "are"} running now, not cut short',
                style='dim',
            )
        )


async def _job_records(store: StepStore, job_id: str, status: str | None = None) -> list[Any]:
    """The records of the job's runs (with that status, from their events, when given), newest first
    (as `runs` pages them)."""
    from stepcore.recovery.jobs import job_runs

    runs = [r for r in await job_runs(store, job_id) if status is None or r.status == status]
    records = [await store.get_run(run_id=r.run_id) for r in runs]
    return [r for r in reversed(records) if r is not None]


def job(
    job_id: Annotated[str, typer.Argument(metavar='ID', help='The job id (the id of its first run).')],
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a job: its first run and every resumption, oldest first, with how each stands and who held it.

    The last line says how the job stands: completed, failed, waiting, pending, dead, cancelled, or
    running (an orphan among them, until a worker resumes it).
    """
    from stepcore.cli.ownership_view import ownership_block, read_ownership
    from stepcore.cli.recovery_view import describe_answers
    from stepcore.recovery.answers import read_waiting
    from stepcore.recovery.jobs import job_runs, job_status

    async def body(s: StepStore) -> Any:
        runs = await job_runs(s, job_id)
        told = [(await read_ownership(s, r.run_id), await read_waiting(s, run_id=r.run_id)) for r in runs]
        return runs, told

    runs, told = with_store(store, body)
    status = job_status(runs)
    if as_json:
        echo_json(
            {
                'job_id': job_id,
                'status': status,
                'runs': [
                    {
                        'run_id': r.run_id,
                        'status': r.status,
                        'lease': lease_json(r.lease) if r.lease else None,
                        'ownership': ownership.as_json(),
                        'answers': [a.to_json() for a in waiting.answers.values()] if waiting is not None else [],
                    }
                    for r, (ownership, waiting) in zip(runs, told, strict=True)
                ],
            }
        )
        return
    console = out()
    console.print(job_table(runs, width=console.width))
    for run, (ownership, waiting) in zip(runs, told, strict=True):
        console.print(Text(f'run {run.run_id} ({run.status})', style='bold'))
        block = ownership_block(ownership)
        if block is not None:
            console.print(block)
        if waiting is not None:
            console.print(Group(*describe_answers(waiting)))
    newest = runs[-1].lease
    died = newest.died if newest is not None else ()
    for attempt in died:
        console.print(Text(f'died: {died_text(attempt)}'))
    console.print(Text(f'job {job_id} is {status}' + (f' (newest run {runs[-1].run_id})' if len(runs) > 1 else '')))
