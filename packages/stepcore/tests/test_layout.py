"""The package's layout: subpackages depend only downward, and the modules' old paths still import."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import stepcore

ROOT = Path(stepcore.__file__).parent

TOP = ('cli', 'ui', 'harness')
"""Applications on top of the library: nothing below imports them."""

ALLOWED_TOP_IMPORTS = {'cli': {'ui', 'harness'}, 'ui': set[str](), 'harness': set[str]()}
"""Which applications an application may use: the CLI starts the inspector and the importer."""

MOVED = {
    'content_tracker': 'capability.content_tracker',
    'context': 'capability.context',
    'events': 'capability.events',
    'operations': 'capability.operations',
    'run_state': 'capability.run_state',
    'run_writer': 'capability.run_writer',
    'snapshot_points': 'capability.snapshot_points',
    'tool_calls': 'capability.tool_calls',
    'helpers': 'recovery.history',
    'protocols': 'store.protocols',
    'models': 'store.models',
    'codec': 'store.codec',
    'registration': 'store.registration',
    'lifecycle': 'store.lifecycle',
    'retention': 'store.retention',
    'ids': 'store.ids',
    'writes': 'store.writes',
    'features': 'store.features',
    'memory': 'store.memory',
    'walker': 'media.walker',
    'history': 'engine.history',
    'worker': 'engine.worker',
    'setup_once': 'engine.setup_once',
    'fileio': 'engine.fileio',
    'encryption': 'engine.encryption',
    'registry': 'plugins.registry',
    'hookspecs': 'plugins.hookspecs',
    'plugin': 'plugins.memory',
    'options': 'plugins.options',
    'urls': 'plugins.urls',
    'gc': 'maintenance.gc',
}


def _imports(path: Path) -> set[str]:
    """The `stepcore.*` modules a file imports (relative imports resolved)."""
    package = '.'.join(('stepcore', *path.relative_to(ROOT).parent.parts))
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')[: len(package.split('.')) - node.level + 1]
                found.add('.'.join([*base, *([node.module] if node.module else [])]))
            elif node.module:
                found.add(node.module)
    return {name for name in found if name.startswith('stepcore.')}


def _area(module: str) -> str:
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else ''


@pytest.mark.parametrize('path', sorted(ROOT.rglob('*.py')), ids=lambda p: str(p.relative_to(ROOT)))
def test_applications_are_imported_only_from_above(path: Path) -> None:
    area = _area('.'.join(('stepcore', *path.relative_to(ROOT).with_suffix('').parts)))
    for name in _imports(path):
        target = _area(name)
        if target not in TOP or target == area:
            continue
        allowed = ALLOWED_TOP_IMPORTS.get(area, set())
        assert target in allowed, f'{path.relative_to(ROOT)} imports {name}: only {area or "nothing"} above may'


@pytest.mark.parametrize(('old', 'new'), sorted(MOVED.items()))
def test_an_old_module_path_is_the_moved_module(old: str, new: str) -> None:
    assert importlib.import_module(f'stepcore.{old}') is importlib.import_module(f'stepcore.{new}')


def test_stepcore_backend_gives_every_name_it_lists() -> None:
    backend = importlib.import_module('stepcore.backend')
    assert len(set(backend.__all__)) == len(backend.__all__)
    missing = [name for name in backend.__all__ if not hasattr(backend, name)]
    assert not missing
    assert backend.EngineStore is importlib.import_module('stepcore.engine').EngineStore
