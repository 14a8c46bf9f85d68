"""`stepcore plugins` lists every installed distribution's backends, with features read from the store classes."""

from __future__ import annotations

import json
import types
from typing import Any

import pluggy
import pytest
from typer.testing import CliRunner

from stepcore.cli import app, misc_commands
from stepcore.common.features import (
    CHECKSUMS,
    ENCRYPTION,
    ENGINE_PORT,
    LEASES,
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
)
from stepcore.plugins import hookspecs
from stepcore.plugins.hookspecs import PROJECT_NAME, BackendInfo, hookimpl
from stepcore.plugins.registry import Registry

OURS = {
    'stepcore': {('step', 'memory')},
    'step-file': {('step', 'file')},
    'step-sqlite': {('step', 'sqlite'), ('media', 'sqlite')},
    'step-mongo': {('step', 'mongo'), ('media', 'mongo')},
    'media-disk': {('media', 'disk')},
    'media-s3': {('media', 's3')},
}


def _backends(rows: list[dict[str, Any]]) -> dict[str, set[tuple[str, str]]]:
    return {row['distribution']: {(b['kind'], b['key']) for b in row['backends']} for row in rows}


def test_plugins_json_lists_all_six_distributions() -> None:
    result = CliRunner().invoke(app, ['plugins', '--json'])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    backends = _backends(rows)
    for distribution, expected in OURS.items():
        assert backends.get(distribution) == expected, f'{distribution}: {backends.get(distribution)}'
    by_key = {(b['kind'], b['key']): b for row in rows for b in row['backends']}
    assert by_key[('step', 'memory')]['features'] == sorted(
        [SNAPSHOT_RETENTION, ENCRYPTION, CHECKSUMS, ENGINE_PORT, LEASES]
    )
    assert set(by_key[('step', 'sqlite')]['features']) == {
        SNAPSHOT_RETENTION,
        MEDIA_EXTERNALIZATION,
        PERSISTENT,
        ENCRYPTION,
        CHECKSUMS,
        ENGINE_PORT,
        LEASES,
    }
    assert by_key[('step', 'memory')]['urls'] == ['memory://']
    assert by_key[('step', 'sqlite')]['urls'] == ['sqlite://']
    assert by_key[('step', 'mongo')]['urls'] == ['mongodb://', 'mongodb+srv://']
    assert by_key[('step', 'postgres')]['urls'] == ['postgresql://', 'postgres://']
    assert by_key[('media', 'disk')]['urls'] == []
    assert not [b for b in by_key.values() if 'unavailable' in b]
    for row in rows:
        assert row['version'] not in ('', 'unknown'), row
        for backend in row['backends']:
            assert backend['summary'], backend


def test_plugins_table_names_every_backend() -> None:
    result = CliRunner().invoke(app, ['plugins'], env={'COLUMNS': '200'})
    assert result.exit_code == 0, result.output
    for distribution in OURS:
        assert distribution in result.stdout


def _registry_with_a_missing_driver() -> Registry:
    def register_step_stores() -> list[BackendInfo]:
        return [
            BackendInfo(key='gone', factory='stepcore_missing_driver.store:GoneStore', summary='Needs a driver.'),
            BackendInfo(key='here', factory='stepcore.engine.memory:InMemoryStepStore', summary='Works.'),
        ]

    module = types.ModuleType('stepcore_gone_plugin')
    vars(module).update(register_step_stores=hookimpl(register_step_stores))
    manager = pluggy.PluginManager(PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    manager.register(module, name='gone-store')
    return Registry(manager)


def test_a_backend_whose_driver_is_missing_is_listed_as_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(misc_commands, 'get_registry', _registry_with_a_missing_driver)
    result = CliRunner().invoke(app, ['plugins', '--json'])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    gone, here = row['backends']
    assert gone['key'] == 'gone'
    assert gone['unavailable'] == "ModuleNotFoundError: No module named 'stepcore_missing_driver'"
    assert gone['features'] == []
    assert here['features'] == sorted([SNAPSHOT_RETENTION, ENCRYPTION, CHECKSUMS, ENGINE_PORT, LEASES])
    assert 'unavailable' not in here
    table = CliRunner().invoke(app, ['plugins'], env={'COLUMNS': '250'})
    assert table.exit_code == 0, table.output
    assert "unavailable: No module named 'stepcore_missing_driver'" in table.stdout
    assert 'snapshot_retention' in table.stdout
