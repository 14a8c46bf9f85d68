"""The plugin registry: lookups, install hints, key collisions, lazy factories, options and features from the class."""

from __future__ import annotations

import re
import sys
import types
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pluggy
import pytest

import stepcore
from stepcore.common.features import (
    CHECKSUMS,
    ENCRYPTION,
    ENGINE_PORT,
    LEASES,
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
)
from stepcore.engine.memory import InMemoryStepStore
from stepcore.plugins import hookspecs
from stepcore.plugins.hookspecs import PROJECT_NAME, BackendInfo, hookimpl
from stepcore.plugins.registry import Kind, Registry, build_manager, get_registry, load_factory, store_from_spec


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


def info(key: str, factory: str = 'stepcore.engine.memory:InMemoryStepStore') -> BackendInfo:
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
    with pytest.raises(ValueError, match="unknown backend 'dynamo' for a step store") as raised:
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
    monkeypatch.syspath_prepend(str(tmp_path))  # pyright: ignore[reportUnknownMemberType]
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
        load_factory('stepcore.engine.memory:Nope')


def test_installed_distributions_are_found_through_entry_points() -> None:
    registry = get_registry()
    assert {'memory', 'file', 'sqlite', 'mongo'} <= set(registry.keys('step'))
    assert {'disk', 'sqlite', 'mongo', 's3'} <= set(registry.keys('media'))
    distributions = {p.distribution for p in registry.plugins}
    assert {'stepcore', 'step-file', 'step-sqlite', 'step-mongo', 'media-disk', 'media-s3'} <= distributions
    memory = registry.get('step', 'memory')
    assert memory.distribution == 'stepcore'
    assert memory.features() == InMemoryStepStore.features
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
    with pytest.raises(ValueError, match="unknown backend 'nonexistent' for a step store"):
        stepcore.from_spec('nonexistent')


def test_misspelled_option_names_the_backend_the_options_and_a_close_match() -> None:
    with pytest.raises(ValueError, match='databse') as raised:
        stepcore.from_spec(backend='sqlite', databse='runs.db')
    text = str(raised.value)
    assert text.startswith("step store backend 'sqlite' has no option 'databse' (did you mean 'database'?)")
    assert 'it takes: database, connection, media_store, media_threshold_bytes, max_snapshots_per_run' in text


def test_store_from_spec_checks_options_too() -> None:
    with pytest.raises(ValueError, match="'max_snapshot' \\(did you mean 'max_snapshots_per_run'\\?\\), 'colour'"):
        store_from_spec('memory', max_snapshot=2, colour='red')


def test_misspelled_media_option_is_refused() -> None:
    with pytest.raises(ValueError, match="'dir'") as raised:
        stepcore.media_from_spec('disk', dir='blobs')
    assert str(raised.value) == (
        "media store backend 'disk' has no option 'dir' (did you mean 'directory'?); "
        'it takes: directory, key_strategy, public_url, full_fsync'
    )


def test_a_required_option_left_out_is_named() -> None:
    with pytest.raises(ValueError, match="media store backend 'disk' needs option 'directory'; it takes: directory"):
        stepcore.media_from_spec('disk')


def test_private_constructor_parameters_are_not_options() -> None:
    with pytest.raises(ValueError, match="has no option '_handle'") as raised:
        stepcore.media_from_spec('postgres', dsn='postgresql://localhost/x', _handle=None)
    assert '_handle' not in str(raised.value).split('it takes:')[1]


def test_a_factory_taking_any_keyword_is_not_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module_name = write_module(
        tmp_path, monkeypatch, 'class Store:\n    def __init__(self, **options):\n        pass\n'
    )
    registry = Registry(manager_with(('open', plugin_module('open', step=[info('open', f'{module_name}:Store')]))))
    assert registry.get('step', 'open').options() is None
    registry.create('step', 'open', anything=1)


def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> str:
    """A module importable under a fresh name, not imported yet."""
    module_name = f'stepcore_test_backend_{uuid.uuid4().hex[:8]}'
    (tmp_path / f'{module_name}.py').write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))  # pyright: ignore[reportUnknownMemberType]
    return module_name


def test_features_are_read_from_the_class_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module_name = write_module(
        tmp_path,
        monkeypatch,
        'class Store:\n    features = frozenset({"persistent"})\n\nclass Plain:\n    pass\n',
    )
    registry = Registry(
        manager_with(
            (
                'classes',
                plugin_module(
                    'classes',
                    step=[info('declared', f'{module_name}:Store')],
                    media=[info('plain', f'{module_name}:Plain')],
                ),
            )
        )
    )
    assert module_name not in sys.modules
    assert registry.get('step', 'declared').features() == frozenset({PERSISTENT})
    assert module_name in sys.modules
    assert registry.get('media', 'plain').features() == frozenset()


def test_features_that_are_not_a_frozenset_are_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module_name = write_module(tmp_path, monkeypatch, 'class Store:\n    features = "persistent"\n')
    registry = Registry(manager_with(('bad', plugin_module('bad', step=[info('bad', f'{module_name}:Store')]))))
    with pytest.raises(TypeError, match=r"Store\.features must be a frozenset of feature names, got 'persistent'"):
        registry.get('step', 'bad').features()


def test_features_of_a_backend_whose_driver_is_missing_raise_import_error() -> None:
    registry = Registry(
        manager_with(('gone', plugin_module('gone', step=[info('gone', 'stepcore_no_such_driver.store:Store')])))
    )
    with pytest.raises(ImportError, match='stepcore_no_such_driver'):
        registry.get('step', 'gone').features()


def test_every_installed_step_backend_declares_its_features_on_the_class() -> None:
    registry = get_registry()
    for key in ('file', 'sqlite', 'mongo', 'postgres', 'redis'):
        backend = registry.get('step', key)
        assert backend.features() == {
            SNAPSHOT_RETENTION,
            MEDIA_EXTERNALIZATION,
            PERSISTENT,
            ENCRYPTION,
            CHECKSUMS,
            ENGINE_PORT,
            LEASES,
        }, key
        assert backend.features() == backend.load().features


def test_backend_info_features_are_ignored_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match='declare the features once, on the store class'):
        entry = BackendInfo(
            key='old', factory='stepcore.engine.memory:InMemoryStepStore', features=frozenset({PERSISTENT})
        )
    registry = Registry(manager_with(('old', plugin_module('old', step=[entry]))))
    assert registry.get('step', 'old').features() == InMemoryStepStore.features


@pytest.mark.parametrize('scheme', ['sqlite://', 'SQLite', '1db', ''])
def test_url_schemes_must_be_bare_lowercase_schemes(scheme: str) -> None:
    with pytest.raises(ValueError, match='is not a lowercase URL scheme'):
        BackendInfo(key='x', factory='stepcore.engine.memory:InMemoryStepStore', schemes=(scheme,))


def test_a_scheme_claimed_by_two_backends_is_an_error_naming_both() -> None:
    def claiming(key: str) -> BackendInfo:
        return BackendInfo(key=key, factory='stepcore.engine.memory:InMemoryStepStore', schemes=('shared',))

    manager = manager_with(
        ('acme-store', plugin_module('acme', step=[claiming('acme')])),
        ('other-store', plugin_module('other', step=[claiming('other')])),
    )
    with pytest.raises(RuntimeError, match="URL scheme shared:// is claimed by two step backends, 'acme'"):
        Registry(manager)


def test_a_declared_scheme_reads_its_url_with_the_plugin_function() -> None:
    seen: list[str] = []

    def options_of(url: str) -> dict[str, object]:
        seen.append(url)
        return {'max_snapshots_per_run': url.rsplit('/', 1)[1]}

    entry = BackendInfo(
        key='keep',
        factory='stepcore.engine.memory:InMemoryStepStore',
        schemes=('keep', 'keep+n'),
        url_options=options_of,
    )
    registry = Registry(manager_with(('keep', plugin_module('keep', step=[entry]))))
    backend, options = registry.for_url('step', 'keep+n://host/7')
    assert (backend.info.key, options, seen) == ('keep', {'max_snapshots_per_run': '7'}, ['keep+n://host/7'])
    store = backend.create(**backend.merge_options(options, {}))
    assert isinstance(store, InMemoryStepStore)
    assert store.max_snapshots_per_run == 7
    assert registry.schemes('step') == ['keep', 'keep+n']


def test_url_text_is_converted_for_int_float_and_bool_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module_name = write_module(
        tmp_path,
        monkeypatch,
        'from __future__ import annotations\n\n'
        'class Store:\n'
        '    def __init__(self, *, name: str = "", size: int | None = None, ratio: float = 1.0, fast: bool = False):\n'
        '        self.values = (name, size, ratio, fast)\n',
    )
    registry = Registry(manager_with(('typed', plugin_module('typed', step=[info('typed', f'{module_name}:Store')]))))
    backend, options = registry.for_url('step', 'typed://?name=007&size=12&ratio=0.5&fast=yes')
    assert backend.create(**backend.merge_options(options, {})).values == ('007', 12, 0.5, True)
    for query, message in [('fast=maybe', 'must be true or false'), ('ratio=half', 'must be a number')]:
        with pytest.raises(ValueError, match=message):
            backend.merge_options(registry.for_url('step', f'typed://?{query}')[1], {})


def test_every_hookspec_is_documented() -> None:
    specs: list[Callable[..., object]] = [hookspecs.register_step_stores, hookspecs.register_media_stores]
    for spec in specs:
        assert spec.__doc__
        assert spec.__doc__.strip()
