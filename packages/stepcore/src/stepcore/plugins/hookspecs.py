"""Plugin hooks: how a distribution tells stepcore which backends it provides."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

import pluggy

__all__ = (
    'PROJECT_NAME',
    'BackendInfo',
    'UrlOptions',
    'backend_hooks',
    'hookimpl',
    'hookspec',
    'register_media_stores',
    'register_step_stores',
)

PROJECT_NAME = 'stepcore'
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

UrlOptions = Callable[[str], Mapping[str, Any]]
"""Maps a store URL to the keyword options of the backend's store class."""

_SCHEME = re.compile(r'[a-z][a-z0-9+.-]*')


@dataclass(frozen=True, kw_only=True)
class BackendInfo:
    """A lazily loaded backend: nothing is imported until it is asked for.

    What the store can do is declared once, on its class (`features`); stepcore reads it from
    there when asked (`stepcore plugins`, the conformance kit).
    """

    key: str
    """The name users pass as `backend=` (e.g. `'sqlite'`)."""
    factory: str
    """`"module:Class"` to import and call with the spec's options."""
    summary: str = ''
    """One line shown by `stepcore plugins`."""
    schemes: tuple[str, ...] = ()
    """URL schemes that name this backend in `stepcore.open_store(url)` and `--store` (e.g. `('sqlite',)`).

    Without any, the backend still opens from `KEY://?option=value`.
    """
    url_options: UrlOptions | None = None
    """Maps a URL of one of `schemes` to keyword options for the store class.

    It runs at URL resolution, so it lives in the plugin module (or a sibling as light) and
    imports no driver. It raises `ValueError`, saying what a usable URL looks like, for a URL it
    cannot use, and returns a local file or folder as a `pathlib.Path` (so tools can check that
    it exists). Default: the URL's query string, `?option=value&...`.
    """
    default_location: Mapping[str, Any] = field(default_factory=dict[str, Any])
    """The options `StepPersistence.from_spec` adds when a spec names no location: none of these
    options and none of `location_options` (e.g. `{'database': '.step-persistence.db'}`)."""
    location_options: tuple[str, ...] = ()
    """Other options that also say where the store keeps its data (e.g. `('connection',)`)."""
    check_location: str | None = None
    """`"module:function"` called with the local file or folder a URL names, when it exists, before a
    reading tool (`stepcore` commands, the inspector) opens it; it raises `ValueError` saying what
    is wrong (`'runs' is a folder, not a SQLite database file ...`). Imported only when called."""
    features: InitVar[frozenset[str] | None] = None
    """Ignored: declare features on the store class (`features: ClassVar[frozenset[str]]`)."""

    def __post_init__(self, features: frozenset[str] | None) -> None:
        if features is not None:
            warnings.warn(
                f'BackendInfo(features=...) for backend {self.key!r} is ignored: declare the features once, on the '
                'store class, as features: ClassVar[frozenset[str]] = frozenset({...})',
                DeprecationWarning,
                stacklevel=3,
            )
        for scheme in self.schemes:
            if not _SCHEME.fullmatch(scheme):
                raise ValueError(
                    f'backend {self.key!r}: URL scheme {scheme!r} is not a lowercase URL scheme '
                    '(a letter, then letters, digits, "+", "-" or ".", without "://")'
                )


@hookspec
def register_step_stores() -> Sequence[BackendInfo]:  # type: ignore[empty-body]
    """Return the `StepStore` backends this plugin provides."""


@hookspec
def register_media_stores() -> Sequence[BackendInfo]:  # type: ignore[empty-body]
    """Return the `MediaStore` backends this plugin provides."""


Hook = Callable[[], Sequence[BackendInfo]]


def backend_hooks(
    *, step: Sequence[BackendInfo] | BackendInfo = (), media: Sequence[BackendInfo] | BackendInfo = ()
) -> tuple[Hook, Hook]:
    """A plugin's two hooks at once, answering the step and media backends it provides:

        register_step_stores, register_media_stores = backend_hooks(
            step=BackendInfo(key='sqlite', factory='step_sqlite.store:SqliteStepStore', ...),
            media=BackendInfo(key='sqlite', factory='step_sqlite.media:SqliteMediaStore', ...),
        )

    Bind them to those two names in the plugin module (the module the entry point names): the
    plugin manager finds a hook by its name there.
    """
    steps = [step] if isinstance(step, BackendInfo) else list(step)
    medias = [media] if isinstance(media, BackendInfo) else list(media)

    @hookimpl
    def register_step_stores() -> Sequence[BackendInfo]:
        return list(steps)

    @hookimpl
    def register_media_stores() -> Sequence[BackendInfo]:
        return list(medias)

    return register_step_stores, register_media_stores
