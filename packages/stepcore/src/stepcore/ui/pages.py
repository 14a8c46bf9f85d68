"""The web app: read-only pages over one `StepStore`, served by Starlette.

Every route answers GET (and HEAD) only; nothing here calls a store method that writes. Pages are
Jinja2 templates with autoescaping on, so every stored string is shown as text, and a strict
Content-Security-Policy keeps the browser from running or loading anything but this app's own
script, styles and media.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from pydantic_ai.messages import ModelMessage
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stepcore.engine import DamagedRecordError
from stepcore.recovery.standing import standing_of
from stepcore.store.models import SnapshotState, SnapshotSummary, utcnow
from stepcore.store.step_store import StepStore
from stepcore.ui import queries
from stepcore.ui.conversation import INLINE_MEDIA_TYPES, MessageView, message_views, part_binaries
from stepcore.ui.diff import diff_snapshots
from stepcore.ui.snippets import display_url, recovery_snippets

__all__ = ('LOOPBACK_HOSTS', 'MESSAGES_PER_PAGE', 'SECURITY_HEADERS', 'create_app')

MESSAGES_PER_PAGE = 200
LEDGER_PER_PAGE = 200

SECURITY_HEADERS = {
    'content-security-policy': (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; media-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    'x-content-type-options': 'nosniff',
    'x-frame-options': 'DENY',
    'referrer-policy': 'no-referrer',
    'cross-origin-resource-policy': 'same-origin',
}
"""Sent with every response."""

LOOPBACK_HOSTS = ('localhost', '127.0.0.1', '::1')

_SAFE_FILENAME = re.compile(r'[^A-Za-z0-9._-]+')


def _host_of(header: str) -> str:
    """The host name of a Host header, without its port (`[::1]:8765` -> `::1`)."""
    if header.startswith('['):
        return header[1 : header.find(']')] if ']' in header else header
    return header.rsplit(':', 1)[0] if header.count(':') == 1 else header


def _is_loopback_name(host: str) -> bool:
    if host.lower() == 'localhost' or host.lower().endswith('.localhost'):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Guard:
    """Adds the security headers to every response; with `loopback_only`, refuses other Host names.

    The Host check keeps a web page elsewhere from reaching this server through a DNS name that it
    points at 127.0.0.1 (DNS rebinding).
    """

    def __init__(self, app: ASGIApp, *, loopback_only: bool) -> None:
        self.app = app
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope['type'] != 'http':
            await self.app(scope, receive, send)
            return
        if self.loopback_only:
            host = ''
            for name, value in scope.get('headers', []):
                if name == b'host':
                    host = value.decode('latin-1')
            if not _is_loopback_name(_host_of(host)):
                response = Response(
                    f'Host {host!r} refused: this server only answers to {", ".join(LOOPBACK_HOSTS)}. '
                    'Start it with --host to serve other names.',
                    status_code=421,
                    media_type='text/plain',
                )
                await response(scope, receive, self._with_headers(send))
                return
        await self.app(scope, receive, self._with_headers(send))

    @staticmethod
    def _with_headers(send: Send) -> Send:
        async def wrapped(message: Message) -> None:
            if message['type'] == 'http.response.start':
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
                if 'cache-control' not in headers:
                    headers['cache-control'] = 'no-store'
            await send(message)

        return wrapped


# -- template helpers -----------------------------------------------------------------------------


def _duration(value: timedelta | None) -> str:
    if value is None:
        return ''
    seconds = value.total_seconds()
    if seconds < 0:
        return f'-{_duration(-value)}'
    if seconds < 1:
        return f'{seconds * 1000:.1f} ms'
    if seconds < 120:
        return f'{seconds:.2f} s'
    minutes, rest = divmod(seconds, 60)
    if minutes < 120:
        return f'{int(minutes)} min {rest:.0f} s'
    hours, minutes = divmod(minutes, 60)
    return f'{int(hours)} h {int(minutes)} min'


def _offset(value: timedelta | None) -> str:
    """A time since the run's first event, signed: `+1.50 s`, or `-0.4 ms` before it."""
    if value is None:
        return ''
    return _duration(value) if value.total_seconds() < 0 else f'+{_duration(value)}'


def _when(value: datetime | None) -> str:
    if value is None:
        return ''
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime('%Y-%m-%d %H:%M:%S')


def _size(n: int) -> str:
    if n < 1024:
        return f'{n} bytes'
    if n < 1024 * 1024:
        return f'{n / 1024:.1f} KiB'
    return f'{n / 1024 / 1024:.1f} MiB'


def _pretty_json(value: object) -> str:
    try:
        return json.dumps(value, indent=1, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _run_url(run_id: str, *rest: object) -> str:
    tail = ''.join(f'/{quote(str(r), safe="")}' for r in rest)
    return f'/runs/{quote(run_id, safe="")}{tail}'


def _job_url(job_id: str) -> str:
    return f'/jobs/{quote(job_id, safe="")}'


def _query(base: str, **params: object) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, '', False)}
    return f'{base}?{urlencode(kept)}' if kept else base


@functools.cache
def _environment() -> Environment:
    """The templates' environment, one per process: every inspector shares its compiled templates."""
    env = Environment(
        loader=PackageLoader('stepcore.ui', 'templates'),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters['duration'] = _duration
    env.filters['offset'] = _offset
    env.filters['when'] = _when
    env.filters['size'] = _size
    env.filters['pretty_json'] = _pretty_json
    helpers: dict[str, Any] = {'run_url': _run_url, 'job_url': _job_url, 'query': _query}
    env.globals.update(helpers)
    return env


# -- the app ----------------------------------------------------------------------------------


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


PARTS_KEPT = 32
"""Parts of snapshots the inspector keeps decoded (a page of messages, the messages a snapshot adds
to the one before it, a message holding media), so that paging back and forth and loading a page's
images decode each message once."""


class _Snapshots:
    """Reads a run's snapshots a part at a time, and keeps the parts it decoded.

    A stored snapshot never changes, but a run can be deleted and written again under the same id:
    a kept part is used only while the store's summary still matches the one it was read under.
    """

    def __init__(self, store: StepStore, size: int = PARTS_KEPT) -> None:
        self._store = store
        self._size = size
        self._kept: OrderedDict[tuple[str, int, int, int], tuple[SnapshotSummary, list[ModelMessage]]] = OrderedDict()
        self._shared: OrderedDict[tuple[str, int, int], tuple[SnapshotSummary, SnapshotSummary, int]] = OrderedDict()

    async def find(self, run_id: str, seq: int) -> tuple[list[SnapshotSummary], int]:
        """The run's snapshot summaries and the position of `seq` among them; `LookupError` naming
        the seqs there are."""
        retained = await self._store.list_snapshot_summaries(run_id, include_interrupted=True)
        position = next((i for i, s in enumerate(retained) if s.seq == seq), None)
        if position is None:
            have = ', '.join(str(s.seq) for s in retained) or 'none'
            raise LookupError(f'run {run_id!r} has no snapshot with seq {seq}; its retained snapshots: {have}')
        return retained, position

    async def messages(self, summary: SnapshotSummary, start: int, stop: int) -> list[ModelMessage]:
        """Messages `start` to `stop` of the summarized snapshot."""
        start, stop = min(start, summary.message_count), min(stop, summary.message_count)
        if stop <= start:
            return []
        key = (summary.run_id, summary.seq, start, stop)
        found = self._kept.get(key)
        if found is not None and found[0] == summary:
            self._kept.move_to_end(key)
            return found[1]
        part = await self._store.get_snapshot_messages(summary.run_id, summary.seq, start=start, stop=stop)
        if part is None:
            raise LookupError(f'snapshot {summary.seq} of run {summary.run_id!r} is gone (deleted or pruned)')
        self._kept[key] = (summary, part.messages)
        while len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return part.messages

    async def shared(self, summary: SnapshotSummary, previous: SnapshotSummary) -> int:
        """How many leading messages the snapshot shares with the one before it, as stored."""
        key = (summary.run_id, summary.seq, previous.seq)
        found = self._shared.get(key)
        if found is not None and found[:2] == (summary, previous):
            return found[2]
        count = await self._store.shared_message_count(summary.run_id, summary.seq, previous.seq)
        self._shared[key] = (summary, previous, count)
        while len(self._shared) > self._size:
            self._shared.popitem(last=False)
        return count


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
    ctx = _Context(store=store, store_url=store_url, media_hint=media_hint, env=_environment())
    snapshots_kept = _Snapshots(store)

    def render(request: Request, template: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        page = ctx.env.get_template(template).render(
            store_url=display_url(ctx.store_url), path=request.url.path, **values
        )
        return HTMLResponse(page, status_code=status_code)

    async def runs(request: Request) -> Response:
        status = _text_param(request, 'status')
        if status is not None and status not in queries.STATUSES:
            raise HTTPException(400, f'status={status!r} is not one of {", ".join(queries.STATUSES)}')
        where = queries.RunFilter(
            agent=_text_param(request, 'agent'),
            conversation=_text_param(request, 'conversation'),
            parent=_text_param(request, 'parent'),
            status=status,
            prefix=_text_param(request, 'q'),
        )
        if where.prefix and 'page' not in request.query_params and await queries.is_job(store, where.prefix):
            # a job's id (its first run's): the job page lists its runs
            return RedirectResponse(_job_url(where.prefix), status_code=303)
        found = await queries.runs_page(store, where, _int_param(request, 'page'))
        if where.prefix and found.page.total == 1 and 'page' not in request.query_params:
            # finding a run by the start of its id: one match opens it
            return RedirectResponse(_run_url(found.rows[0].record.run_id), status_code=303)
        return render(request, 'runs.html', where=where, found=found, statuses=queries.STATUSES)

    async def _record(run_id: str) -> Any:
        record = await store.get_run(run_id=run_id)
        if record is None:
            raise LookupError(f'run {run_id!r} is not in this store: find it by the start of its id on the runs page')
        return record

    async def run(request: Request) -> Response:
        run_id = request.path_params['run_id']
        record = await _record(run_id)
        facts = await queries.run_facts(store, run_id)
        effects = await store.list_tool_effects(run_id=run_id)
        report = await queries.recovery_view(store, record, run_id, effects)
        ledger_page = queries.page_of(_int_param(request, 'ledger'), LEDGER_PER_PAGE, len(effects))
        status = report.shown_status or facts.status
        family = await queries.lineage(store, record, status, len(report.unresolved_effects), running=report.live)
        ownership = await queries.ownership_of(store, record, report.standing)
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
            effects=queries.unresolved_first(effects)[ledger_page.start : ledger_page.end],
            ledger_page=ledger_page,
            lineage=family,
            answers=queries.answers_of(report, now),
            held=ownership,
            now=now,
        )

    async def timeline(request: Request) -> Response:
        run_id = request.path_params['run_id']
        record = await _record(run_id)
        standing = await standing_of(store, run_id)
        changes = standing.lease.history if standing.lease is not None else ()
        rows, page, facts = await queries.timeline_page(store, run_id, _int_param(request, 'page'), changes=changes)
        return render(
            request,
            'timeline.html',
            record=record,
            status=queries.shown_status(standing),
            standing=standing,
            rows=rows,
            page=page,
            span=facts.span,
            change_count=len(changes),
        )

    async def job(request: Request) -> Response:
        job_id = request.path_params['job_id']
        first = await queries.first_run_of(store, job_id)
        if first is not None and first != job_id:
            # a resumption: its job is the chain's first run
            return RedirectResponse(_job_url(first), status_code=303)
        view = await queries.job_view(store, job_id, utcnow())
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
            status=queries.shown_status(await standing_of(store, run_id)),
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
        page = queries.page_of(_int_param(request, 'page', default_page), MESSAGES_PER_PAGE, total)
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
    return _Guard(app, loopback_only=loopback_only)
