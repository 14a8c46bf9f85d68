"""Store URLs: which backend a `--store` URL names, and with which options.

| URL | backend | options |
|---|---|---|
| `sqlite:///runs.db` (relative), `sqlite:////abs/runs.db` | `sqlite` | `database=<path>` |
| `file:///abs/runs`, `file:runs` (relative) | `file` | `directory=<path>` |
| `mongodb://host:27017/mydb`, `mongodb+srv://...` | `mongo` | `db_url=<url without the db>`, `database=mydb` |
| `postgresql://...`, `postgres://...` | `postgres` | the URL, as the store's connection-string option |
| `KEY://?option=value` | any installed plugin key | the query string, as keyword options |

`memory://` is refused: an in-memory store lives inside one process, so there is nothing to
inspect from another one.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ..protocols import StepStore
from ..registry import get_registry, load_factory

__all__ = ('ENV_VAR', 'StoreError', 'StoreTarget', 'open_store', 'parse_store_url')

ENV_VAR = 'STEPCORE_STORE'
"""Environment variable read when `--store` is not given."""

_EXAMPLES = 'sqlite:///runs.db, file:///path/to/runs, mongodb://localhost:27017/mydb'
_POSTGRES_URL_OPTIONS = ('dsn', 'conninfo', 'url', 'database_url', 'db_url')


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


def _path_of(url: str, scheme: str) -> str:
    parts = urlsplit(url)
    if parts.netloc not in ('', 'localhost'):
        # `file://runs` and `sqlite://runs.db`: the "host" is really the start of a relative path.
        return parts.netloc + parts.path
    path = parts.path
    if scheme == 'sqlite' and path.startswith('/'):
        # SQLAlchemy's convention: three slashes for a relative path, four for an absolute one.
        path = path[1:]
    return path


def parse_store_url(url: str) -> StoreTarget:
    """Map a store URL to a backend key and options; `StoreError` when it cannot be used."""
    url = url.strip()
    if '://' not in url and ':' not in url:
        raise StoreError(f'store {url!r} is not a URL: use one like {_EXAMPLES}')
    scheme = urlsplit(url).scheme.lower()
    if scheme == 'memory':
        raise StoreError(
            'memory:// cannot be inspected: an in-memory store lives and dies inside one process. '
            f'Persist runs to a store another process can open, e.g. {_EXAMPLES}'
        )
    if scheme == 'sqlite':
        path = _path_of(url, scheme)
        if not path:
            raise StoreError(f'store URL {url!r} names no database file: use sqlite:///runs.db')
        local = Path(path).expanduser()
        return StoreTarget(backend='sqlite', options={'database': local}, local_path=local)
    if scheme == 'file':
        path = _path_of(url, scheme)
        if not path:
            raise StoreError(f'store URL {url!r} names no folder: use file:///path/to/runs')
        local = Path(path).expanduser()
        return StoreTarget(backend='file', options={'directory': local}, local_path=local)
    if scheme in ('mongodb', 'mongodb+srv'):
        parts = urlsplit(url)
        database = parts.path.lstrip('/')
        if not database or '/' in database:
            raise StoreError(f'store URL {url!r} names no database: add it as the path, e.g. mongodb://localhost/runs')
        db_url = urlunsplit((parts.scheme, parts.netloc, '/', parts.query, ''))
        return StoreTarget(backend='mongo', options={'db_url': db_url, 'database': database})
    if scheme in ('postgresql', 'postgres'):
        return StoreTarget(backend='postgres', options={'__url__': url})
    registry = get_registry()
    if scheme in registry.keys('step'):
        parts = urlsplit(url)
        return StoreTarget(backend=scheme, options=dict(parse_qsl(parts.query)))
    installed = ', '.join(k for k in registry.keys('step') if k != 'memory') or 'none'
    raise StoreError(
        f'unknown store URL scheme {scheme!r} in {url!r}. Installed step-store backends: {installed}. '
        f'Use a URL like {_EXAMPLES}, or KEY:// for another installed backend'
    )


def resolve_store_url(url: str | None) -> str:
    """The `--store` value, else `$STEPCORE_STORE`; `StoreError` when neither is set."""
    if url:
        return url
    env = os.environ.get(ENV_VAR, '').strip()
    if env:
        return env
    raise StoreError(f'no store given: pass --store URL or set {ENV_VAR} (e.g. {ENV_VAR}=sqlite:///runs.db)')


def _postgres_options(factory: Any, url: str) -> dict[str, Any]:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        params = {}
    for name in _POSTGRES_URL_OPTIONS:
        if name in params:
            return {name: url}
    return {'dsn': url}


def open_store(url: str, *, must_exist: bool = True) -> StepStore:
    """Build the store a URL names.

    With `must_exist`, a local database file or folder that is not there is an error rather than
    an empty store created as a side effect of looking.
    """
    target = parse_store_url(url)
    if must_exist and target.local_path is not None and not target.local_path.exists():
        raise StoreError(
            f'no {target.describe()}: {url!r} does not exist. Check the path, or run `stepcore demo` first'
        )
    path = target.local_path
    if target.backend == 'sqlite' and path is not None:
        if path.is_dir():
            raise StoreError(f'{str(path)!r} is a folder, not a SQLite database file: for a folder of runs use file://')
        if path.is_file():
            _check_sqlite_file(path)
    if target.backend == 'file' and path is not None and path.exists() and not path.is_dir():
        raise StoreError(f'{str(path)!r} is a file, not a folder of runs: for a SQLite database use sqlite://')
    registry = get_registry()
    try:
        backend = registry.get('step', target.backend)
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    factory = load_factory(backend.info.factory)
    options = dict(target.options)
    if '__url__' in options:
        options = _postgres_options(factory, str(options['__url__']))
    try:
        return cast(StepStore, factory(**options))
    except TypeError as exc:
        raise StoreError(f'cannot open a {target.backend} store with options {sorted(options)}: {exc}') from None


def _check_sqlite_file(path: Path) -> None:
    try:
        with path.open('rb') as f:
            header = f.read(16)
    except OSError as exc:
        raise StoreError(f'cannot read database {str(path)!r}: {exc.strerror or exc}') from None
    if header and header != b'SQLite format 3\x00':
        raise StoreError(f'{str(path)!r} is not a SQLite database: point --store at a database written by stepcore')
