"""Registers this distribution's backends with stepcore (imports no driver at load time)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from stepcore.backend import (
    BackendInfo,
    backend_hooks,
)

STORE_OPTIONS = ('key_prefix', 'max_snapshots_per_run', 'media_store', 'media_threshold_bytes')
"""Query parameters of a store URL that are store options; the others are the client's."""


def redis_url_options(url: str) -> dict[str, str]:
    """`redis://:secret@host:6379/0?key_prefix=app` -> `url=` (without the store options) and `key_prefix='app'`.

    The rest of the query (`socket_timeout=5`, `ssl_cert_reqs=none`, ...) stays in the URL:
    redis-py reads it as connection options.
    """
    url = url.strip()
    parts = urlsplit(url)
    path = parts.path.strip('/')
    if path and not path.isdigit():
        raise ValueError(
            f'store URL {url!r} names database {path!r}: a Redis database is a number, e.g. redis://localhost:6379/0'
        )
    options: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in STORE_OPTIONS:
            rest.append((name, value))
        elif name in options:
            raise ValueError(f'store URL {url!r} gives option {name!r} twice: keep one')
        else:
            options[name] = value
    return {'url': urlunsplit(parts._replace(query=urlencode(rest))), **options}


register_step_stores, register_media_stores = backend_hooks(
    step=BackendInfo(
        key='redis',
        factory='step_redis.store:RedisStepStore',
        schemes=('redis', 'rediss'),
        url_options=redis_url_options,
        summary="Keys under a prefix in a Redis server, one Lua script per write (redis-py's asyncio client).",
    ),
    media=BackendInfo(
        key='redis',
        factory='step_redis.media:RedisMediaStore',
        summary='Content-addressed blobs as strings in a Redis server (small media).',
    ),
)
