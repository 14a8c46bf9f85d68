"""Store URLs: the pieces a plugin's `url_options` function reads (no driver is imported here).

A plugin maps its own URLs to keyword options, e.g. SQLite's:

    def sqlite_url_options(url: str) -> dict[str, Any]:
        return {'database': local_path(url, what='database file', example='sqlite:///runs.db',
                                       strip_slash=True), **query_options(url)}
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

__all__ = ('URL_EXAMPLES', 'local_path', 'query_options', 'url_path', 'url_scheme')

URL_EXAMPLES = 'sqlite:///runs.db, file:///path/to/runs, mongodb://localhost:27017/mydb, postgresql://host/db'
"""Store URLs to show in an error."""


def url_scheme(url: str) -> str:
    """The URL's scheme, lowercased; `ValueError` for a string that is not a URL."""
    url = url.strip()
    scheme = urlsplit(url).scheme.lower() if ':' in url else ''
    if not scheme:
        raise ValueError(f'store {url!r} is not a URL: use one like {URL_EXAMPLES}')
    return scheme


def url_path(url: str, *, strip_slash: bool = False) -> str:
    """The path a URL names: `file:///abs/dir` -> `/abs/dir`, `file:rel/dir` or `file://rel/dir` -> `rel/dir`.

    With `strip_slash`, one leading slash is dropped, SQLAlchemy's convention (three slashes for
    a relative path, four for an absolute one): `sqlite:///runs.db` -> `runs.db`.
    """
    parts = urlsplit(url.strip())
    if parts.netloc not in ('', 'localhost'):
        # `file://runs` and `sqlite://runs.db`: the "host" is really the start of a relative path.
        return parts.netloc + parts.path
    path = parts.path
    if strip_slash and path.startswith('/'):
        path = path[1:]
    return path


def local_path(url: str, *, what: str, example: str, strip_slash: bool = False) -> Path:
    """The local file or folder a URL names (`~` expanded); `ValueError` when it names none."""
    path = url_path(url, strip_slash=strip_slash)
    if not path:
        raise ValueError(f'store URL {url.strip()!r} names no {what}: use {example}')
    return Path(path).expanduser()


def query_options(url: str) -> dict[str, str]:
    """The query string as options: `KEY://?max_snapshots_per_run=5` -> `{'max_snapshots_per_run': '5'}`.

    Values stay text; `stepcore.open_store` converts those the store class types as `int`,
    `float` or `bool`.
    """
    options: dict[str, str] = {}
    for name, value in parse_qsl(urlsplit(url.strip()).query, keep_blank_values=True):
        if name in options:
            raise ValueError(f'store URL {url.strip()!r} gives option {name!r} twice: keep one')
        options[name] = value
    return options
