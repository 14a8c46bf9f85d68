"""The web app: read-only pages over one `StepStore`, served by Starlette.

Every route answers GET (and HEAD) only; nothing here calls a store method that writes. Pages are
Jinja2 templates with autoescaping on, so every stored string is shown as text, and a strict
Content-Security-Policy keeps the browser from running or loading anything but this app's own
script, styles and media.

Every response goes through `stepcore.ui.middleware` (security headers, Host check); the templates'
filters and link helpers are `stepcore.ui.filters`; what each page reads is in the query modules
(`stepcore.ui.queries` and its siblings).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import Environment
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from stepcore.engine import DamagedRecordError
from stepcore.recovery.standing import standing_of
from stepcore.store.models import SnapshotState, utcnow
from stepcore.store.step_store import StepStore
from stepcore.ui.conversation import INLINE_MEDIA_TYPES, MessageView, message_views, part_binaries
from stepcore.ui.diff import diff_snapshots
from stepcore.ui.filters import environment, job_url, run_url
from stepcore.ui.job_page import job_view
from stepcore.ui.lineage import lineage
from stepcore.ui.middleware import Guard
from stepcore.ui.ownership_rows import first_run_of, is_job, ownership_of
from stepcore.ui.queries import page_of, run_facts, shown_status
from stepcore.ui.recovery_panel import answers_of, recovery_view, unresolved_first
from stepcore.ui.runs import STATUSES, RunFilter, runs_page
from stepcore.ui.snapshot_parts import SnapshotParts
from stepcore.ui.snippets import display_url, recovery_snippets
from stepcore.ui.timeline import timeline_page

__all__ = ('MESSAGES_PER_PAGE', 'create_app')

MESSAGES_PER_PAGE = 200
LEDGER_PER_PAGE = 200

_SAFE_FILENAME = re.compile(r'[^A-Za-z0-9._-]+')


@dataclass(frozen=True, kw_only=True)
class _Context:
    store: StepStore
    store_url: str
    media_hint: str | None
    env: Environment


def _int_param(request: Request, name: str, default: int = 1) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == '':
        return default
    try:
        return int(raw)
    except ValueError:
        raise HTTPException(400, f'{name}={raw!r} is not a whole number: use a page number such as {name}=2') from None


def _text_param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, '').strip()
    return value or None


def create_app(
    store: StepStore,
    *,
    store_url: str,
    media_hint: str | None = None,
    loopback_only: bool = True,
) -> ASGIApp:
    """The inspector over `store`; `store_url` is only shown (with any password hidden) and used in code snippets.

    `media_hint` is the Python expression of the media store, for the snippets. With
    `loopback_only`, requests naming a host other than a loopback one are refused.
    """
    ctx = _Context(store=store, store_url=store_url, media_hint=media_hint, env=environment())
    snapshots_kept = SnapshotParts(store)

    def render(request: Request, template: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        page = ctx.env.get_template(template).render(
            store_url=display_url(ctx.store_url), path=request.url.path, **values
        )
        return HTMLResponse(page, status_code=status_code)

    async def runs(request: Request) -> Response:
        status = _text_param(request, 'status')
        if status is not None and status not in STATUSES:
            raise HTTPException(400, f'status={status!r} is not one of {", ".join(STATUSES)}')
        where = RunFilter(
            agent=_text_param(request, 'agent'),
            conversation=_text_param(request, 'conversation'),
            parent=_text_param(request, 'parent'),
            status=status,
            prefix=_text_param(request, 'q'),
        )
        if where.prefix and 'page' not in request.query_params and await is_job(store, where.prefix):
            # a job's id (its first run's): the job page lists its runs
            return RedirectResponse(job_url(where.prefix), status_code=303)
        found = await runs_page(store, where, _int_param(request, 'page'))
        if where.prefix and found.page.total == 1 and 'page' not in request.query_params:
            # finding a run by the start of its id: one match opens it
            return RedirectResponse(run_url(found.rows[0].record.run_id), status_code=303)
        return render(request, 'runs.html', where=where, found=found, statuses=STATUSES)

    async def _record(run_id: str) -> Any:
        record = await store.get_run(run_id=run_id)
        if record is None:
            raise LookupError(f'run {run_id!r} is not in this store: find it by the start of its id on the runs page')
        return record

    async def run(request: Request) -> Response:
        run_id = request.path_params['run_id']
        record = await _record(run_id)
        facts = await run_facts(store, run_id)
        effects = await store.list_tool_effects(run_id=run_id)
        report = await recovery_view(store, record, run_id, effects)
        ledger_page = page_of(_int_param(request, 'ledger'), LEDGER_PER_PAGE, len(effects))
        status = report.shown_status or facts.status
        family = await lineage(store, record, status, len(report.unresolved_effects), running=report.live)
        ownership = await ownership_of(store, record, report.standing)
        now = utcnow()
        return render(
            request,
            'run.html',
            record=record,
            status=status,
            event_count=facts.event_count,
            span=facts.span,
            report=report,
            snippets=recovery_snippets(report, store_url=ctx.store_url, media_hint=ctx.media_hint),
            unresolved=report.unresolved_effects,
            effects=unresolved_first(effects)[ledger_page.start : ledger_page.end],
            ledger_page=ledger_page,
            lineage=family,
            answers=answers_of(report, now),
            held=ownership,
            now=now,
        )

    async def timeline(request: Request) -> Response:
        run_id = request.path_params['run_id']
        record = await _record(run_id)
        standing = await standing_of(store, run_id)
        changes = standing.lease.history if standing.lease is not None else ()
        rows, page, facts = await timeline_page(store, run_id, _int_param(request, 'page'), changes=changes)
        return render(
            request,
            'timeline.html',
            record=record,
            status=shown_status(standing),
            standing=standing,
            rows=rows,
            page=page,
            span=facts.span,
            change_count=len(changes),
        )

    async def job(request: Request) -> Response:
        job_id = request.path_params['job_id']
        first = await first_run_of(store, job_id)
        if first is not None and first != job_id:
            # a resumption: its job is the chain's first run
            return RedirectResponse(job_url(first), status_code=303)
        view = await job_view(store, job_id, utcnow())
        return render(request, 'job.html', job=view)

    async def snapshots(request: Request) -> Response:
        run_id = request.path_params['run_id']
        record = await _record(run_id)
        retained = await store.list_snapshot_summaries(run_id, include_interrupted=True)
        settled = next((s.seq for s in reversed(retained) if s.state is SnapshotState.COMPLETE), None)
        return render(
            request,
            'snapshots.html',
            record=record,
            status=shown_status(await standing_of(store, run_id)),
            snapshots=retained,
            settled_seq=settled,
        )

    async def snapshot(request: Request) -> Response:
        run_id = request.path_params['run_id']
        seq = request.path_params['seq']
        record = await _record(run_id)
        retained, position = await snapshots_kept.find(run_id, seq)
        snap = retained[position]
        following = retained[position + 1] if position + 1 < len(retained) else None
        previous = retained[position - 1] if position else None
        # Only what the page shows and what differs from the previous snapshot is decoded: a long
        # history mostly repeats the one before it, and the store says how much without reading it.
        count = snap.message_count
        shared = await snapshots_kept.shared(snap, previous) if previous is not None else 0
        tail = message_views(await snapshots_kept.messages(snap, shared, count), first=shared)
        diff = None
        if previous is not None:
            before = message_views(
                await snapshots_kept.messages(previous, shared, previous.message_count), first=shared
            )
            diff = diff_snapshots(before, tail, previous_seq=previous.seq, kept=shared)
        only_changes = request.query_params.get('only') == 'changes'
        changed = [v for v in tail if v.change]
        total = len(changed) if only_changes else count
        default_page = -(-total // MESSAGES_PER_PAGE) or 1
        page = page_of(_int_param(request, 'page', default_page), MESSAGES_PER_PAGE, total)
        if only_changes:
            shown = changed[page.start : page.end]
        else:
            head: list[MessageView] = []
            if page.start < shared:
                head = message_views(
                    await snapshots_kept.messages(snap, page.start, min(page.end, shared)), first=page.start
                )
            shown = head + tail[max(0, page.start - shared) : max(0, page.end - shared)]
        settled = next((s.seq for s in reversed(retained) if s.state is SnapshotState.COMPLETE), None)
        return render(
            request,
            'snapshot.html',
            record=record,
            snap=snap,
            messages=shown,
            page=page,
            only_changes=only_changes,
            diff=diff,
            previous=previous,
            following=following,
            newest=following is None,
            settled=settled == snap.seq,
        )

    async def media(request: Request) -> Response:
        run_id: str = request.path_params['run_id']
        seq: int = request.path_params['seq']
        retained, position = await snapshots_kept.find(run_id, seq)
        message: int = request.path_params['message']
        part: int = request.path_params['part']
        item: int = request.path_params['item']
        try:
            held = await snapshots_kept.messages(retained[position], message, message + 1)
            content = part_binaries(held, 0, part)[item]
        except IndexError:
            raise HTTPException(
                404, f'snapshot {seq} of run {run_id!r} has no media at {message}/{part}/{item}'
            ) from None
        media_type = content.media_type.split(';')[0].strip().lower()
        headers = {'content-security-policy': "default-src 'none'; sandbox", 'cache-control': 'private, max-age=300'}
        if media_type not in INLINE_MEDIA_TYPES:
            name = _SAFE_FILENAME.sub('_', content.identifier or f'{run_id}-{seq}-{message}-{part}-{item}')
            headers['content-disposition'] = f'attachment; filename="{name}"'
            media_type = 'application/octet-stream'
        return Response(content.data, media_type=media_type, headers=headers)

    async def error_page(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            code, text = exc.status_code, str(exc.detail)
            if code == 404 and text == 'Not Found':
                text = f'there is no page at {request.url.path}'
            elif code == 405:
                text = 'this inspector is read-only: it answers GET requests only'
        elif isinstance(exc, DamagedRecordError):
            code, text = 500, str(exc)
        elif isinstance(exc, LookupError):
            code, text = 404, str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        else:
            code, text = 500, f'{type(exc).__name__}: {exc}'
        return render(request, 'error.html', status_code=code, code=code, message=text)

    routes: Sequence[Route | Mount] = [
        Route('/', runs, methods=['GET']),
        Route('/runs/{run_id}', run, methods=['GET']),
        Route('/runs/{run_id}/timeline', timeline, methods=['GET']),
        Route('/jobs/{job_id}', job, methods=['GET']),
        Route('/runs/{run_id}/snapshots', snapshots, methods=['GET']),
        Route('/runs/{run_id}/snapshots/{seq:int}', snapshot, methods=['GET']),
        Route('/runs/{run_id}/snapshots/{seq:int}/media/{message:int}/{part:int}/{item:int}', media, methods=['GET']),
        Mount('/static', app=StaticFiles(packages=[('stepcore.ui', 'static')]), name='static'),
    ]
    app = Starlette(
        routes=list(routes),
        exception_handlers={
            HTTPException: error_page,
            LookupError: error_page,
            ValueError: error_page,
            Exception: error_page,
        },
    )
    return Guard(app, loopback_only=loopback_only)
