"""The templates' Jinja2 environment: the filters that format stored values (durations, times, sizes, JSON)
and the helpers that build the inspector's links."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined

__all__ = ('environment', 'job_url', 'run_url')


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


def run_url(run_id: str, *rest: object) -> str:
    """The address of a run's page, or of a page under it (`rest`, each part quoted)."""
    tail = ''.join(f'/{quote(str(r), safe="")}' for r in rest)
    return f'/runs/{quote(run_id, safe="")}{tail}'


def job_url(job_id: str) -> str:
    """The address of a job's page."""
    return f'/jobs/{quote(job_id, safe="")}'


def _query(base: str, **params: object) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, '', False)}
    return f'{base}?{urlencode(kept)}' if kept else base


@functools.cache
def environment() -> Environment:
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
    helpers: dict[str, Any] = {'run_url': run_url, 'job_url': job_url, 'query': _query}
    env.globals.update(helpers)
    return env
