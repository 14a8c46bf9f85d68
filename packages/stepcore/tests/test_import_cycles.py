"""No package of the workspace has an import cycle between its modules.

Imports are read with `ast`, not run: at module level and inside functions alike (an import
deferred into a function to get past a circle hides the circle, it does not remove it), leaving
out only those under `if TYPE_CHECKING:`. `from package import name` counts as importing the
submodule `name` when there is one, else the package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SOURCES = sorted([*ROOT.glob('packages/*/src'), *ROOT.glob('tests-shared/src')])


def _modules(src: Path) -> dict[str, tuple[Path, bool]]:
    """`{dotted name: (path, is a package)}` of every module under `src`."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in src.rglob('*.py'):
        parts = list(path.relative_to(src).with_suffix('').parts)
        package = parts[-1] == '__init__'
        if package:
            parts.pop()
        found['.'.join(parts)] = (path, package)
    return found


def _imported(name: str, path: Path, package: bool, known: dict[str, tuple[Path, bool]]) -> set[str]:
    """The modules of `known` that module `name` imports."""
    here = name if package else name.rpartition('.')[0]
    names: set[str] = set()

    def walk(nodes: list[ast.stmt]) -> Iterator[ast.stmt]:
        for node in nodes:
            if isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test):
                yield from walk(node.orelse)
                continue
            yield node
            for field in ('body', 'orelse', 'finalbody', 'handlers'):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from walk([n for n in inner if isinstance(n, ast.stmt | ast.ExceptHandler)])  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]

    for node in walk(ast.parse(path.read_text(encoding='utf-8')).body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here.split('.')[: len(here.split('.')) - node.level + 1] if node.level else []
            module = '.'.join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f'{module}.{alias.name}'
                names.add(sub if sub in known else module)
    found: set[str] = set()
    for imported in names:
        while imported and imported not in known:
            imported = imported.rpartition('.')[0]
        if imported and imported != name:
            found.add(imported)
    return found


def import_cycles(src: Path) -> list[list[str]]:
    """Each set of modules under `src` that import each other in a circle (Tarjan's algorithm)."""
    known = _modules(src)
    graph = {name: _imported(name, path, package, known) for name, (path, package) in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            members: list[str] = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == module:
                    break
            if len(members) > 1:
                cycles.append(sorted(members))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_every_package_is_checked() -> None:
    names = {src.parent.name for src in SOURCES}
    assert {
        'stepcore',
        'step-sqlite',
        'step-file',
        'step-postgres',
        'step-redis',
        'step-mongo',
        'tests-shared',
    } <= names


@pytest.mark.parametrize('src', SOURCES, ids=[src.parent.name for src in SOURCES])
def test_no_import_cycle(src: Path) -> None:
    assert import_cycles(src) == []


def test_a_cycle_through_a_deferred_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / 'pkg'
    package.mkdir()
    (package / '__init__.py').write_text('from .store import Store\n')
    (package / 'store.py').write_text('from .harness import migrate\n\nclass Store: ...\n')
    (package / 'harness.py').write_text('def migrate():\n    from .store import Store\n    return Store\n')
    (package / 'schema.py').write_text(
        'from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .store import Store\n'
    )
    (package / 'media.py').write_text('from . import schema\n')
    assert import_cycles(tmp_path) == [['pkg.harness', 'pkg.store']]
