"""The conformance kit imports stepcore only through `stepcore` and `stepcore.backend`.

Third-party backends run the kit (`tests-shared`) against their stores: it relies on what stepcore
promises, the public API and the backend face, and never on a module inside the package, which
moves when the package is rearranged. Checked in the kit's modules, in its own tests, and in the
modules those tests write out for pytester (stores written as a third party writes them).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import stepcore

ROOT = Path(__file__).resolve().parents[1]
KIT = sorted((ROOT / 'tests-shared').rglob('*.py'))
THROUGH = ('stepcore', 'stepcore.backend')
"""The two modules the kit may import stepcore names from."""


def _modules(path: Path) -> Iterator[tuple[str, ast.Module]]:
    """The file's module, and each module its strings hold (code a test writes out for pytester)."""
    tree = ast.parse(path.read_text(encoding='utf-8'))
    yield str(path.relative_to(ROOT)), tree
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and 'stepcore' in node.value:
            try:
                written = ast.parse(node.value)
            except SyntaxError:
                continue
            if any(isinstance(inner, ast.Import | ast.ImportFrom) for inner in written.body):
                yield f'{path.relative_to(ROOT)}:{node.lineno} (a module it writes)', written


def stepcore_paths(tree: ast.Module) -> list[tuple[int, str]]:
    """Every stepcore path the module reaches: what it imports, and `stepcore.<name>` read off the package."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == 'stepcore'
            and node.attr not in (*stepcore.__all__, '__version__', 'backend')
        ):
            # `import stepcore` then `stepcore.engine...` goes around the faces as surely as an import
            found.append((node.lineno, f'stepcore.{node.attr}'))
    return [(line, name) for line, name in found if name == 'stepcore' or name.startswith('stepcore.')]


def test_there_are_kit_modules_to_check() -> None:
    assert len([p for p in KIT if '/src/' in p.as_posix()]) >= 30, KIT


@pytest.mark.parametrize('path', KIT, ids=lambda p: str(p.relative_to(ROOT / 'tests-shared')))
def test_a_kit_module_imports_stepcore_only_through_its_faces(path: Path) -> None:
    for where, tree in _modules(path):
        for line, name in stepcore_paths(tree):
            assert name in THROUGH, (
                f'{where}, line {line}, reaches {name}: take the name from stepcore if it is public, else from '
                'stepcore.backend (add it there, handed on from where it lives)'
            )


def test_the_check_sees_every_way_around_the_faces() -> None:
    tree = ast.parse(
        'import stepcore\n'
        'import stepcore.engine\n'
        'from stepcore.store.leases import Fence\n'
        'from stepcore import StepStore\n'
        'from stepcore.backend import ops\n'
        'def f():\n'
        '    from stepcore.engine._seal import Sealer\n'
        '    return stepcore.engine.EngineStore, stepcore.StepStore, stepcore.__version__\n'
    )
    outside = sorted(name for _, name in stepcore_paths(tree) if name not in THROUGH)
    assert outside == ['stepcore.engine', 'stepcore.engine', 'stepcore.engine._seal', 'stepcore.store.leases']
