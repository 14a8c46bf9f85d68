"""The plugin registry: lookups, install hints, key collisions, lazy factories."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path

import pluggy
import pytest

import stepcore
from stepcore import hookspecs
from stepcore.features import SNAPSHOT_RETENTION
from stepcore.hookspecs import PROJECT_NAME, BackendInfo, hookimpl
from stepcore.memory import InMemoryStepStore
from stepcore.registry import Kind, Registry, build_manager, get_registry, load_factory


def plugin_module(name: str, step: Sequence[BackendInfo] = (), media: Sequence[BackendInfo] = ()) -> types.ModuleType:
    """A plugin module built in memory, as a distribution's `plugin.py` would be."""
    module = types.ModuleType(name)

    def register_step_stores() -> list[BackendInfo]:
        return list(step)

    def register_media_stores() -> list[BackendInfo]:
        return list(media)

    vars(module).update(
        register_step_stores=hookimpl(register_step_stores), register_media_stores=hookimpl(register_media_stores)
    )
    return module


def manager_with(*plugins: tuple[str, types.ModuleType]) -> pluggy.PluginManager:
    manager = pluggy.PluginManager(PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    for name, module in plugins:
        manager.register(module, name=name)
    return manager


def info(key: str, factory: str = 'stepcore.memory:InMemoryStepStore') -> BackendInfo:
    return BackendInfo(key=key, factory=factory, summary=f'{key} backend')


def test_backends_are_listed_by_kind_and_plugin() -> None:
    registry = Registry(
        manager_with(
            ('dist-a', plugin_module('dist_a', step=[info('alpha'), info('beta')])),
            ('dist-b', plugin_module('dist_b', media=[info('blobs')])),
        )
    )
    assert registry.keys('step') == ['alpha', 'beta']
    assert registry.keys('media') == ['blobs']
    by_name = {p.name: [b.info.key for b in p.backends] for p in registry.plugins}
    assert by_name == {'dist-a': ['alpha', 'beta'], 'dist-b': ['blobs']}
    assert registry.get('step', 'beta').distribution == 'dist-a'


def test_unknown_key_names_the_known_keys() -> None:
    registry = Registry(manager_with(('dist-a', plugin_module('dist_a', step=[info('alpha'), info('beta')]))))
    with pytest.raises(ValueError, match="unknown step store backend 'dynamo'") as raised:
        registry.get('step', 'dynamo')
    assert "'alpha', 'beta'" in str(raised.value)
    assert 'pip install' not in str(raised.value)


@pytest.mark.parametrize(
    ('kind', 'key', 'package'),
    [
        ('step', 'mongo', 'step-mongo'),
        ('step', 'sqlite', 'step-sqlite'),
        ('media', 's3', 'media-s3'),
        ('media', 'disk', 'media-disk'),
    ],
)
def test_unknown_key_of_our_own_backends_gives_the_install_command(kind: Kind, key: str, package: str) -> None:
    registry = Registry(manager_with(('dist-a', plugin_module('dist_a', step=[info('alpha')]))))
    with pytest.raises(ValueError, match=f'pip install {package}'):
        registry.get(kind, key)


def test_two_distributions_claiming_one_key_is_an_error_naming_both() -> None:
    manager = manager_with(
        ('acme-store', plugin_module('acme', step=[info('shared')])),
        ('other-store', plugin_module('other', step=[info('shared')])),
    )
    with pytest.raises(RuntimeError, match='shared') as raised:
        Registry(manager)
    assert 'acme-store' in str(raised.value)
    assert 'other-store' in str(raised.value)


def test_one_key_in_both_kinds_is_not_a_collision() -> None:
    registry = Registry(
        manager_with(('dist-a', plugin_module('dist_a', step=[info('sqlite')], media=[info('sqlite')])))
    )
    assert registry.keys('step') == registry.keys('media') == ['sqlite']


def test_factories_load_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module_name = 'stepcore_lazy_backend_for_tests'
    (tmp_path / f'{module_name}.py').write_text(
        'class Store:\n    def __init__(self, **options):\n        self.options = options\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module_name, raising=False)
    registry = Registry(manager_with(('lazy', plugin_module('lazy', step=[info('lazy', f'{module_name}:Store')]))))
    assert module_name not in sys.modules
    store = registry.create('step', 'lazy', path='x', size=3)
    assert module_name in sys.modules
    assert store.options == {'path': 'x', 'size': 3}


@pytest.mark.parametrize('spec', ['no_colon', ':Class', 'module:'])
def test_load_factory_rejects_malformed_specs(spec: str) -> None:
    with pytest.raises(ValueError, match=re.escape('package.module:Class')):
        load_factory(spec)


def test_load_factory_reports_a_missing_attribute() -> None:
    with pytest.raises(ImportError, match="has no attribute 'Nope'"):
        load_factory('stepcore.memory:Nope')


def test_installed_distributions_are_found_through_entry_points() -> None:
    registry = get_registry()
    assert {'memory', 'file', 'sqlite', 'mongo'} <= set(registry.keys('step'))
    assert {'disk', 'sqlite', 'mongo', 's3'} <= set(registry.keys('media'))
    distributions = {p.distribution for p in registry.plugins}
    assert {'stepcore', 'step-file', 'step-sqlite', 'step-mongo', 'media-disk', 'media-s3'} <= distributions
    memory = registry.get('step', 'memory')
    assert memory.distribution == 'stepcore'
    assert memory.info.features == InMemoryStepStore.features
    assert memory.version == stepcore.__version__


def test_memory_is_registered_even_without_entry_points() -> None:
    manager = build_manager(load_entrypoints=False)
    assert Registry(manager).keys('step') == ['memory']


def test_from_spec_builds_a_store_with_options() -> None:
    store = stepcore.from_spec('memory', max_snapshots_per_run=2)
    assert isinstance(store, InMemoryStepStore)
    assert store.max_snapshots_per_run == 2
    assert SNAPSHOT_RETENTION in type(store).features
    assert isinstance(stepcore.from_spec(), InMemoryStepStore)


def test_from_spec_never_falls_back_to_memory() -> None:
    with pytest.raises(ValueError, match="unknown step store backend 'nonexistent'"):
        stepcore.from_spec('nonexistent')


def test_every_hookspec_is_documented() -> None:
    specs: list[Callable[..., object]] = [hookspecs.register_step_stores, hookspecs.register_media_stores]
    for spec in specs:
        assert spec.__doc__
        assert spec.__doc__.strip()
