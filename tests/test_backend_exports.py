"""Every name `stepcore.backend` hands on is used by a backend, the backend template or the conformance kit.

`stepcore.backend` is what a backend author reads to know what they may rely on: a name there that
no backend, no template file and no kit module takes is a promise kept for nobody, and one more
thing to keep stable. Uses are read with `ast`: `from stepcore.backend import name`, and
`backend.name` after `from stepcore import backend` or `import stepcore.backend as backend`. The
template's files (`stepcore new-backend`) are read with their placeholders filled in; the kit's,
with the modules its tests write out for pytester. Names users import stay in `stepcore` itself.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import stepcore.backend

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = sorted(p for p in ROOT.glob('packages/*/src/**/*.py') if 'packages/stepcore/' not in p.as_posix())
TEMPLATE = sorted((ROOT / 'packages/stepcore/src/stepcore/cli/backend_template').rglob('*.py.tmpl'))
KIT = sorted((ROOT / 'tests-shared').rglob('*.py'))
_PLACEHOLDER = re.compile(r'\{\{(\w+)\}\}')


def _modules(path: Path) -> Iterator[ast.Module]:
    """The file as a module (a template's placeholders filled in), and each module its strings hold."""
    text = _PLACEHOLDER.sub(r'\1', path.read_text(encoding='utf-8'))
    tree = ast.parse(text)
    yield tree
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and 'stepcore.backend' in node.value:
            try:
                yield ast.parse(node.value)
            except SyntaxError:
                continue


def names_used(tree: ast.Module) -> set[str]:
    """The names of `stepcore.backend` a module takes."""
    used: set[str] = set()
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == 'stepcore.backend' and not node.level:
            used.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == 'stepcore' and not node.level:
            aliases.update(alias.asname or alias.name for alias in node.names if alias.name == 'backend')
        elif isinstance(node, ast.Import):
            aliases.update(alias.asname for alias in node.names if alias.name == 'stepcore.backend' and alias.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
            (isinstance(node.value, ast.Name) and node.value.id in aliases)
            or (isinstance(node.value, ast.Attribute) and ast.unparse(node.value) == 'stepcore.backend')
        ):
            used.add(node.attr)
    return used


def uses() -> dict[str, set[str]]:
    """`{file: names of stepcore.backend it uses}` for every backend module, template file and kit module."""
    found: dict[str, set[str]] = {}
    for path in [*BACKENDS, *TEMPLATE, *KIT]:
        names = set[str]().union(*(names_used(tree) for tree in _modules(path)))
        if names:
            found[str(path.relative_to(ROOT))] = names
    return found


def test_the_users_are_found() -> None:
    found = uses()
    assert any(f.startswith('packages/step-sqlite/') for f in found)
    assert any(f.endswith('store.py.tmpl') for f in found)
    assert any(f.startswith('tests-shared/src/') for f in found)
    assert any(f.startswith('tests-shared/tests/') for f in found), 'the modules the kit writes out are read too'


def test_every_name_stepcore_backend_hands_on_is_used() -> None:
    used = set[str]().union(*uses().values())
    listed: set[str] = set(stepcore.backend.__all__)
    unused = sorted(listed - used)
    assert not unused, (
        f'stepcore.backend hands on {unused}, which no backend, template file or kit module uses: '
        'remove them from stepcore.backend (a name users import belongs in stepcore)'
    )


def test_every_name_taken_from_stepcore_backend_is_handed_on() -> None:
    listed: set[str] = set(stepcore.backend.__all__)
    unknown = {f: sorted(names - listed) for f, names in uses().items() if names - listed}
    assert not unknown, f'these take names stepcore.backend does not list in __all__: {unknown}'


def test_uses_are_read_however_the_module_is_reached() -> None:
    tree = ast.parse(
        'from stepcore.backend import EngineStore, ops as port_ops\n'
        'from stepcore import backend\n'
        'import stepcore.backend as face\n'
        'import stepcore.backend\n'
        'backend.SyncPort, face.MediaEngine, stepcore.backend.BlobPort\n'
    )
    assert names_used(tree) == {'EngineStore', 'ops', 'SyncPort', 'MediaEngine', 'BlobPort'}
