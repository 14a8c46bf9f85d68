"""Store URLs on the command line: `--store` / `$STEPCORE_STORE`, opened through `stepcore.open_store`.

Each backend's plugin says which URLs open it (see `stepcore.plugins.hookspecs.BackendInfo`); the
built-in ones:

| URL | backend | options |
|---|---|---|
| `sqlite:///runs.db` (relative), `sqlite:////abs/runs.db` | `sqlite` | `database=<path>` |
| `file:///abs/runs`, `file:runs` (relative) | `file` | `directory=<path>` |
| `mongodb://host:27017/mydb`, `mongodb+srv://...` | `mongo` | `db_url=<url without the db>`, `database=mydb` |
| `postgresql://...`, `postgres://...` | `postgres` | `dsn=<the URL>` |
| `redis://host:6379/0`, `rediss://...` | `redis` | `url=<the URL less store options>`, `key_prefix=` from the query |
| `KEY://?option=value` | any installed plugin key | the query string, as keyword options |

On top of that, the command line checks what a reading command needs: `memory://` is refused
(an in-memory store lives inside one process, so there is nothing to inspect from another one),
and a local database file or folder must exist and be of the right kind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepcore.plugins import registry
from stepcore.plugins.urls import URL_EXAMPLES, url_scheme
from stepcore.store.step_store import StepStore

__all__ = ('ENV_VAR', 'StoreError', 'StoreTarget', 'open_store', 'parse_store_url', 'resolve_store_url')

ENV_VAR = 'STEPCORE_STORE'
"""Environment variable read when `--store` is not given."""


class StoreError(Exception):
    """A store URL that cannot be used, with what to do about it."""


@dataclass(frozen=True, kw_only=True)
class StoreTarget:
    """A backend key and the keyword options its store class is built with."""

    backend: str
    options: dict[str, Any] = field(default_factory=dict[str, Any])
    local_path: Path | None = None
    """The file or folder the store lives in, for backends that keep one locally."""

    def describe(self) -> str:
        where = f' at {self.local_path}' if self.local_path is not None else ''
        return f'{self.backend} store{where}'


def parse_store_url(url: str) -> StoreTarget:
    """Map a store URL to a backend key and options; `StoreError` when it cannot be used."""
    try:
        scheme = url_scheme(url)
        if scheme == 'memory':
            raise StoreError(
                'memory:// cannot be inspected: an in-memory store lives and dies inside one process. '
                f'Persist runs to a store another process can open, e.g. {URL_EXAMPLES}'
            )
        backend, options = registry.get_registry().for_url('step', url)
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    return StoreTarget(backend=backend.info.key, options=options, local_path=registry.local_location(options))


def resolve_store_url(url: str | None) -> str:
    """The `--store` value, else `$STEPCORE_STORE`; `StoreError` when neither is set."""
    if url:
        return url
    env = os.environ.get(ENV_VAR, '').strip()
    if env:
        return env
    raise StoreError(f'no store given: pass --store URL or set {ENV_VAR} (e.g. {ENV_VAR}=sqlite:///runs.db)')


def open_store(url: str, *, must_exist: bool = True, **options: Any) -> StepStore:
    """Build the store a URL names, through `stepcore.open_store` (given `options` too, e.g. `media_store=`).

    With `must_exist`, a local database file or folder that is not there, or not what its backend
    keeps, is an error rather than an empty store created as a side effect of looking.
    """
    target = parse_store_url(url)
    try:
        return registry.open_store(url, must_exist=must_exist, **options)
    except registry.StoreLocationError as exc:
        raise StoreError(str(exc)) from None
    except TypeError as exc:
        raise StoreError(f'cannot open a {target.backend} store with options {sorted(target.options)}: {exc}') from None
