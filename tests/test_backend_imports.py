"""Every backend package imports what it needs of stepcore from `stepcore.backend` only.

The backends of this repository, the template, and the backend examples of the docs: a backend
author reads one module to know what they may rely on.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = sorted(
    [*ROOT.glob('packages/step-*/src/*'), *ROOT.glob('packages/media-*/src/*'), *ROOT.glob('examples/*/src/*')]
)
DOCS = [ROOT / 'docs' / 'plugins.md', ROOT / 'docs' / 'engine.md']


def _stepcore_imports(source: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name == 'stepcore' or name.startswith('stepcore.')]


def test_there_are_backends_to_check() -> None:
    assert len(BACKENDS) >= 8, BACKENDS


@pytest.mark.parametrize('package', BACKENDS, ids=lambda p: p.name)
def test_a_backend_imports_stepcore_only_through_stepcore_backend(package: Path) -> None:
    checked = 0
    for path in sorted(package.rglob('*.py')):
        for line, name in _stepcore_imports(path.read_text(encoding='utf-8')):
            checked += 1
            assert name == 'stepcore.backend', (
                f'{path.relative_to(ROOT)}:{line} imports {name}: take it from stepcore.backend '
                '(add it there if a backend needs it)'
            )
    assert checked, f'{package.name} imports nothing from stepcore'


@pytest.mark.parametrize('page', DOCS, ids=lambda p: p.name)
def test_the_backend_examples_of_the_docs_import_from_stepcore_backend(page: Path) -> None:
    code = '\n'.join(re.findall(r'^```python[^\n]*\n(.*?)^```', page.read_text(encoding='utf-8'), re.M | re.S))
    for line in code.splitlines():
        imported = re.match(r'\s*from (stepcore[\w.]*) import', line)
        if imported and imported.group(1) not in ('stepcore', 'stepcore.backend', 'stepcore_conformance'):
            pytest.fail(f'{page.name}: {line.strip()}: a backend takes it from stepcore.backend')
