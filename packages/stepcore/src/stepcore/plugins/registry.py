"""The plugin registry: backends found through the `stepcore` entry-point group."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import urlsplit

import pluggy

from stepcore.plugins import hookspecs
from stepcore.plugins.hookspecs import PROJECT_NAME, BackendInfo
from stepcore.plugins.options import check_options, coerce_text_options, declared_features, option_names
from stepcore.plugins.urls import URL_EXAMPLES, query_options, url_scheme

if TYPE_CHECKING:
    from stepcore.store.step_store import StepStore

__all__ = (
    'KNOWN_PACKAGES',
    'KNOWN_SCHEMES',
    'PluginInfo',
    'RegisteredBackend',
    'Registry',
    'StoreLocationError',
    'check_store_location',
    'get_registry',
    'load_factory',
    'local_location',
    'media_from_spec',
    'open_store',
    'store_from_spec',
)

Kind = Literal['step', 'media']

KNOWN_PACKAGES: dict[tuple[Kind, str], str] = {
    ('step', 'memory'): 'stepcore',
    ('step', 'file'): 'step-file',
    ('step', 'sqlite'): 'step-sqlite',
    ('step', 'mongo'): 'step-mongo',
    ('step', 'postgres'): 'step-postgres',
    ('step', 'redis'): 'step-redis',
    ('media', 'disk'): 'media-disk',
    ('media', 'sqlite'): 'step-sqlite',
    ('media', 'mongo'): 'step-mongo',
    ('media', 's3'): 'media-s3',
    ('media', 'postgres'): 'step-postgres',
    ('media', 'redis'): 'step-redis',
}
"""Our own backends and the distribution that provides each, for install hints."""

KNOWN_SCHEMES: dict[str, str] = {
    'sqlite': 'sqlite',
    'file': 'file',
    'mongodb': 'mongo',
    'mongodb+srv': 'mongo',
    'postgresql': 'postgres',
    'postgres': 'postgres',
    'redis': 'redis',
    'rediss': 'redis',
}
"""URL schemes of our own step-store backends and the key each names, for install hints."""


def _noun(kind: Kind) -> str:
    return 'step store' if kind == 'step' else 'media store'


@dataclass(frozen=True, kw_only=True)
class RegisteredBackend:
    kind: Kind
    info: BackendInfo
    distribution: str
    version: str

    def describe(self) -> str:
        """E.g. `step store backend 'sqlite'`, for messages."""
        return f'{_noun(self.kind)} backend {self.info.key!r}'

    def load(self) -> Any:
        """Import the factory (`ImportError` when the backend's driver is not installed)."""
        return load_factory(self.info.factory)

    def features(self) -> frozenset[str]:
        """The features the store class declares (importing it); empty for a class that declares none."""
        return declared_features(self.load())

    def options(self) -> list[str] | None:
        """The options the store class takes; `None` when it takes any keyword."""
        return option_names(self.load())

    def url_options(self, url: str) -> dict[str, Any]:
        """The store options a URL names, read by the plugin's `url_options` (default: the query)."""
        reader = self.info.url_options if url_scheme(url) in self.info.schemes else None
        if reader is None:
            self._refuse_unread_parts(url)
        found = reader(url) if reader is not None else query_options(url)
        return dict(found)

    def _refuse_unread_parts(self, url: str) -> None:
        """A URL read only for its query (`KEY://?option=value`) must not carry a host or path it would drop."""
        parts = urlsplit(url.strip())
        unread = parts.netloc + parts.path
        if unread in ('', '/'):
            return
        try:
            names = self.options()
        except Exception:  # the driver is not installed: the message can do without the option names
            names = None
        takes = f' ({self.describe()} takes: {", ".join(names)})' if names else ''
        raise ValueError(
            f'store URL {url.strip()!r} names {self.describe()} by its key, so only its query string is read and '
            f'{unread!r} would be ignored: give every option in the query, e.g. '
            f'{self.info.key}://?option=value{takes}'
        )

    def merge_options(self, url_options: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
        """A URL's options (text, converted for parameters typed `int`, `float` or `bool`) with keyword ones.

        One option given both ways with different values is an error.
        """
        url_options, options = _encryption_option(url_options), _encryption_option(options)
        from_url = coerce_text_options(self.describe(), self.load(), url_options)
        clash = sorted(name for name in from_url if name in options and options[name] != from_url[name])
        if clash:
            raise ValueError(
                f'{self.describe()}: option {", ".join(repr(c) for c in clash)} is given both in the URL and as a '
                'keyword, with different values: give it once'
            )
        return {**from_url, **options}

    def create(self, /, **options: Any) -> Any:
        """Build the store, after checking the option names against the factory's signature."""
        factory = self.load()
        check_options(self.describe(), factory, options)
        return factory(**options)


@dataclass(frozen=True, kw_only=True)
class PluginInfo:
    name: str
    distribution: str
    version: str
    backends: tuple[RegisteredBackend, ...]


class Registry:
    """Backends by kind and key, with the distributions that provide them."""

    def __init__(self, manager: pluggy.PluginManager) -> None:
        self.manager = manager
        self._backends: dict[tuple[Kind, str], RegisteredBackend] = {}
        self._schemes: dict[tuple[Kind, str], RegisteredBackend] = {}
        self._plugins: list[PluginInfo] = []
        dists = {id(plugin): dist for plugin, dist in manager.list_plugin_distinfo()}
        for name, plugin in manager.list_name_plugin():
            dist = dists.get(id(plugin))
            dist_name = dist.project_name if dist is not None else name
            version = dist.version if dist is not None else 'unknown'
            found: list[RegisteredBackend] = []
            hooks: tuple[tuple[Kind, str], ...] = (('step', 'register_step_stores'), ('media', 'register_media_stores'))
            for kind, hook in hooks:
                impl = getattr(plugin, hook, None)
                if impl is None:
                    continue
                for info in impl():
                    found.append(self._add(kind, info, dist_name, version))
            self._plugins.append(PluginInfo(name=name, distribution=dist_name, version=version, backends=tuple(found)))

    def _add(self, kind: Kind, info: BackendInfo, dist: str, version: str) -> RegisteredBackend:
        key = (kind, info.key)
        backend = RegisteredBackend(kind=kind, info=info, distribution=dist, version=version)
        other = self._backends.get(key)
        if other is not None and other.distribution != dist:
            raise RuntimeError(
                f'{kind} backend {info.key!r} is registered by two distributions, {other.distribution!r} and '
                f'{dist!r}: uninstall one of them'
            )
        self._backends[key] = backend
        for scheme in info.schemes:
            claimed = self._schemes.get((kind, scheme))
            if claimed is not None and claimed.info.key != info.key:
                raise RuntimeError(
                    f'URL scheme {scheme}:// is claimed by two {kind} backends, {claimed.info.key!r} '
                    f'({claimed.distribution}) and {info.key!r} ({dist}): uninstall one of them'
                )
            self._schemes[(kind, scheme)] = backend
        return backend

    @property
    def plugins(self) -> list[PluginInfo]:
        return list(self._plugins)

    def keys(self, kind: Kind) -> list[str]:
        return sorted(k for (bk, k) in self._backends if bk == kind)

    def schemes(self, kind: Kind) -> list[str]:
        """The URL schemes installed backends declare (each key also works as `KEY://`)."""
        return sorted(s for (bk, s) in self._schemes if bk == kind)

    def get(self, kind: Kind, key: str) -> RegisteredBackend:
        backend = self._backends.get((kind, key))
        if backend is not None:
            return backend
        known = ', '.join(repr(k) for k in self.keys(kind)) or 'none'
        message = f'unknown backend {key!r} for a {_noun(kind)}; installed backends: {known}'
        package = KNOWN_PACKAGES.get((kind, key))
        if package is not None:
            message += f'. Install it with: pip install {package}'
        raise ValueError(message)

    def for_url(self, kind: Kind, url: str) -> tuple[RegisteredBackend, dict[str, Any]]:
        """The backend a URL names (by a declared scheme, else by key) and the options the URL gives."""
        scheme = url_scheme(url)
        backend = self._schemes.get((kind, scheme)) or self._backends.get((kind, scheme))
        if backend is not None:
            return backend, backend.url_options(url)
        installed = ', '.join(self._with_schemes(kind)) or 'none'
        message = (
            f'unknown store URL scheme {scheme!r} in {url.strip()!r}. Installed {kind}-store backends: {installed}. '
            f'Use a URL like {URL_EXAMPLES}, or KEY://?option=value for any installed backend KEY'
        )
        known = KNOWN_SCHEMES.get(scheme) if kind == 'step' else None
        package = KNOWN_PACKAGES.get((kind, known)) if known is not None else None
        if package is not None:
            message += f'. For {scheme}:// install: pip install {package}'
        raise ValueError(message)

    def _with_schemes(self, kind: Kind) -> list[str]:
        """Each installed key with the schemes it declares, e.g. `mongo (mongodb://, mongodb+srv://)`."""
        named: list[str] = []
        for key in self.keys(kind):
            schemes = ', '.join(f'{s}://' for s in self._backends[(kind, key)].info.schemes)
            named.append(f'{key} ({schemes})' if schemes else key)
        return named

    def create(self, kind: Kind, key: str, /, **options: Any) -> Any:
        return self.get(kind, key).create(**options)


ENCRYPTION_ENV_OPTION = 'encryption_env'
"""Option naming the environment variable that holds a store's encryption keys."""
ENCRYPTION_FILE_OPTION = 'encryption_key_file'
"""Option naming the key file that holds a store's encryption keys."""


def _encryption_option(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` with `encryption_env=VAR` or `encryption_key_file=PATH` turned into `encryption=`
    (keys are never given in a URL itself: only where to find them)."""
    found = dict(options)
    if isinstance(found.get('encryption'), str):
        raise ValueError(
            f'encryption= takes a stepcore.Encryption, never key text: name where the keys are with '
            f'{ENCRYPTION_ENV_OPTION}=VARIABLE or {ENCRYPTION_FILE_OPTION}=PATH'
        )
    env, path = found.pop(ENCRYPTION_ENV_OPTION, None), found.pop(ENCRYPTION_FILE_OPTION, None)
    if env is None and path is None:
        return found
    if env is not None and path is not None:
        raise ValueError(f'give one of {ENCRYPTION_ENV_OPTION} and {ENCRYPTION_FILE_OPTION}, not both')
    from stepcore.common.encryption import Encryption

    found['encryption'] = Encryption.from_env(str(env)) if env is not None else Encryption.from_file(str(path))
    return found


def load_factory(spec: str) -> Any:
    """Import a `"module:attribute"` factory."""
    module_name, _, attr = spec.partition(':')
    if not module_name or not attr:
        raise ValueError(f'backend factory {spec!r} must look like "package.module:Class"')
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f'backend factory {spec!r}: module {module_name!r} has no attribute {attr!r}') from None


def build_manager(*, load_entrypoints: bool = True) -> pluggy.PluginManager:
    manager = pluggy.PluginManager(PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    if load_entrypoints:
        manager.load_setuptools_entrypoints(PROJECT_NAME)
    if not any(k == 'memory' for _, p in manager.list_name_plugin() for k in _step_keys(p)):
        from stepcore.plugins import builtin

        manager.register(builtin, name='memory')
    return manager


def _step_keys(plugin: object) -> list[str]:
    impl = getattr(plugin, 'register_step_stores', None)
    return [info.key for info in impl()] if impl is not None else []


@cache
def get_registry() -> Registry:
    """The process-wide registry, loaded from installed entry points on first use."""
    return Registry(build_manager())


def store_from_spec(backend: str = 'memory', **options: Any) -> Any:
    """Build a `StepStore` from a backend key and its constructor options.

    An option the store class does not take raises `ValueError` naming the backend, the option,
    the options it takes and the closest one.
    """
    return get_registry().create('step', backend, **options)


def media_from_spec(backend: str, **options: Any) -> Any:
    """Build a `MediaStore` from a backend key and its constructor options (checked as in `store_from_spec`)."""
    return get_registry().create('media', backend, **options)


def open_store(url: str, /, *, must_exist: bool = False, **options: Any) -> StepStore:
    """Build the `StepStore` a URL names, e.g. `open_store('sqlite:///runs.db', max_snapshots_per_run=20)`.

    The URL's scheme picks the backend (`sqlite://`, `file://`, `mongodb://`, `postgresql://`, or
    `KEY://?option=value` for any installed key); the options it gives are merged with the
    keyword `options`. An unknown scheme, a URL the backend cannot use, or an option its store
    class does not take raises `ValueError`.

    With `must_exist=True` (what reading tools pass), a local file or folder the URL names must
    already be there and pass the backend's `check_location`; otherwise `StoreLocationError` (a
    `ValueError`) says what is wrong, rather than an empty store being created by looking.
    """
    backend, url_options = get_registry().for_url('step', url)
    if must_exist:
        check_store_location(backend, url, url_options)
    return cast('StepStore', backend.create(**backend.merge_options(url_options, options)))


class StoreLocationError(ValueError):
    """A store URL naming a local file or folder that is missing or not what its backend keeps."""


def local_location(url_options: Mapping[str, Any]) -> Path | None:
    """The local file or folder among a URL's options (a plugin's `url_options` gives it as a `Path`)."""
    return next((value for value in url_options.values() if isinstance(value, Path)), None)


def check_store_location(backend: RegisteredBackend, url: str, url_options: Mapping[str, Any]) -> None:
    """`StoreLocationError` when the local file or folder `url` names is missing or its backend refuses it."""
    path = local_location(url_options)
    if path is None:
        return
    if not path.exists():
        raise StoreLocationError(
            f'no {backend.info.key} store at {path}: {url!r} does not exist. '
            'Check the path, or run `stepcore demo` first'
        )
    if backend.info.check_location is not None:
        try:
            load_factory(backend.info.check_location)(path)
        except ValueError as error:
            raise StoreLocationError(str(error)) from None
