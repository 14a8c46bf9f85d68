"""The plugin registry: backends found through the `stepcore` entry-point group."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import pluggy

from . import hookspecs
from .hookspecs import PROJECT_NAME, BackendInfo

__all__ = (
    'KNOWN_PACKAGES',
    'PluginInfo',
    'RegisteredBackend',
    'Registry',
    'get_registry',
    'load_factory',
    'media_from_spec',
    'store_from_spec',
)

Kind = Literal['step', 'media']

KNOWN_PACKAGES: dict[tuple[Kind, str], str] = {
    ('step', 'memory'): 'stepcore',
    ('step', 'file'): 'step-file',
    ('step', 'sqlite'): 'step-sqlite',
    ('step', 'mongo'): 'step-mongo',
    ('step', 'postgres'): 'step-postgres',
    ('media', 'disk'): 'media-disk',
    ('media', 'sqlite'): 'step-sqlite',
    ('media', 'mongo'): 'step-mongo',
    ('media', 's3'): 'media-s3',
    ('media', 'postgres'): 'step-postgres',
}
"""Our own backends and the distribution that provides each, for install hints."""


@dataclass(frozen=True, kw_only=True)
class RegisteredBackend:
    kind: Kind
    info: BackendInfo
    distribution: str
    version: str


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
        return backend

    @property
    def plugins(self) -> list[PluginInfo]:
        return list(self._plugins)

    def keys(self, kind: Kind) -> list[str]:
        return sorted(k for (bk, k) in self._backends if bk == kind)

    def get(self, kind: Kind, key: str) -> RegisteredBackend:
        backend = self._backends.get((kind, key))
        if backend is not None:
            return backend
        noun = 'step store' if kind == 'step' else 'media store'
        known = ', '.join(repr(k) for k in self.keys(kind)) or 'none'
        message = f'unknown {noun} backend {key!r}; installed backends: {known}'
        package = KNOWN_PACKAGES.get((kind, key))
        if package is not None:
            message += f'. Install it with: pip install {package}'
        raise ValueError(message)

    def create(self, kind: Kind, key: str, /, **options: Any) -> Any:
        return load_factory(self.get(kind, key).info.factory)(**options)


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
        from . import plugin

        manager.register(plugin, name='memory')
    return manager


def _step_keys(plugin: object) -> list[str]:
    impl = getattr(plugin, 'register_step_stores', None)
    return [info.key for info in impl()] if impl is not None else []


@cache
def get_registry() -> Registry:
    """The process-wide registry, loaded from installed entry points on first use."""
    return Registry(build_manager())


def store_from_spec(backend: str = 'memory', **options: Any) -> Any:
    """Build a `StepStore` from a backend key and its constructor options."""
    return get_registry().create('step', backend, **options)


def media_from_spec(backend: str, **options: Any) -> Any:
    """Build a `MediaStore` from a backend key and its constructor options."""
    return get_registry().create('media', backend, **options)
