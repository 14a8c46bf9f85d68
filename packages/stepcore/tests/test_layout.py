"""The package's layout: its folders stand in one order, each importing only those below it.

From the ground up (each uses only what stands below it):

1. `backend_io` — blocking I/O local stores share: crash-safe file writes, a store's worker
   thread, a setup run once. It knows nothing of stepcore's records.
2. `common` — what every layer shares: feature names, the damaged-record error, encryption keys.
3. `media` — content-addressed blobs: the media store protocol, the media engine, the walker that
   moves large payloads out of messages. It knows nothing of runs.
4. `store` — the records of a run and the store contract (protocol, base class, adapters), with
   the rules every store shares; stored messages reference media, so it stands on `media`.
5. `engine` — the storage engine: the contract implemented once over a small port per backend.
6. `plugins` — the registry of backends, which builds stores from specs and URLs.
7. `ownership` — run leases: claims, renewal, orphans.
8. `capability` — `StepPersistence`: it builds its store from a spec and holds a lease per run.
9. `recovery` — inspecting, settling and resuming what a crash or a pause left, run by the
   capability again.
10. `maintenance` — whole-store work (media collection).
11. `harness` — reading stores pydantic-ai-harness wrote.
12. `ui` — the web inspector.
13. `cli` — the command line, which starts the inspector and the importer.

The faces at the top, `stepcore` itself, `stepcore.backend` and `python -m stepcore` (which runs
the command line), only hand names on; no module of
a folder imports them. A folder's private modules (`_name.py`) are imported only inside it:
everything else takes the folder's names from its `__init__.py`, which only hands names on.
"""

from __future__ import annotations

import ast
import importlib
from collections import Counter
from pathlib import Path

import pytest

import stepcore

ROOT = Path(stepcore.__file__).parent

ORDER = (
    'backend_io',
    'common',
    'media',
    'store',
    'engine',
    'plugins',
    'ownership',
    'capability',
    'recovery',
    'maintenance',
    'harness',
    'ui',
    'cli',
)
FACES = ('__init__', 'backend', '__main__')
"""The modules at the top of the package: what users and backend authors import, and
`python -m stepcore`."""

SOURCES = sorted(ROOT.rglob('*.py'))


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix('').parts
    if parts[-1] == '__init__':
        parts = parts[:-1]
    return '.'.join(('stepcore', *parts))


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every `stepcore` module the file imports, anywhere in it (inside functions too), with its line."""
    package = _module(path) if path.name == '__init__.py' else _module(path).rsplit('.', 1)[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')[: len(package.split('.')) - node.level + 1]
                found.append((node.lineno, '.'.join([*base, *([node.module] if node.module else [])])))
            elif node.module:
                found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name == 'stepcore' or name.startswith('stepcore.')]


def _folder(module: str) -> str:
    """The folder of a module (`stepcore.engine._ops` -> `engine`), or the face it is."""
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else '__init__'


def test_every_folder_and_module_of_the_package_has_a_place() -> None:
    tops = {p.relative_to(ROOT).parts[0].removesuffix('.py') for p in SOURCES}
    assert tops == {*ORDER, *FACES}, f'not in the order: {sorted(tops - {*ORDER, *FACES})}'


@pytest.mark.parametrize('path', SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_folder_imports_only_folders_below_it(path: Path) -> None:
    mine = _folder(_module(path))
    if mine in FACES:
        return
    for line, name in _imports(path):
        target = _folder(name)
        where = f'{path.relative_to(ROOT)}:{line} imports {name}'
        assert target not in FACES, f'{where}: a folder never imports the faces at the top'
        assert ORDER.index(target) <= ORDER.index(mine), (
            f'{where}: {target} stands above {mine} ({" < ".join(ORDER)}); move what it needs down'
        )


@pytest.mark.parametrize('path', SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_private_modules_are_imported_only_inside_their_folder(path: Path) -> None:
    mine = _folder(_module(path))
    for line, name in _imports(path):
        parts = name.split('.')
        private = [p for p in parts[2:] if p.startswith('_')]
        if private and _folder(name) != mine:
            pytest.fail(f'{path.relative_to(ROOT)}:{line} imports {name}: take the name from stepcore.{parts[1]}')


@pytest.mark.parametrize('path', sorted(ROOT.rglob('__init__.py')), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_folder_init_only_hands_names_on(path: Path) -> None:
    if path.parent == ROOT:
        return  # `stepcore` itself: a face, checked below
    tree = ast.parse(path.read_text(encoding='utf-8'))
    for node in tree.body:
        handing_on = isinstance(node, ast.Import | ast.ImportFrom) or (
            isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ['__all__']
        )
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        assert handing_on or docstring, f'{path.relative_to(ROOT)}:{node.lineno} defines something: move it to a module'


def test_the_faces_only_hand_names_on() -> None:
    for face in FACES:
        tree = ast.parse((ROOT / f'{face}.py').read_text(encoding='utf-8'))
        for node in tree.body:
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else []
            allowed = (
                isinstance(node, ast.Import | ast.ImportFrom | ast.Expr)
                or set(targets) <= {'__all__', '__version__'}
                or _runs_as_main(node)
            )
            assert allowed, f'stepcore/{face}.py:{node.lineno} defines something: move it to a folder'


def _runs_as_main(node: ast.stmt) -> bool:
    """`if __name__ == '__main__':` calling one function."""
    return (
        isinstance(node, ast.If)
        and ast.unparse(node.test) == "__name__ == '__main__'"
        and len(node.body) == 1
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Call)
        and not node.orelse
    )


def test_no_two_modules_share_a_name() -> None:
    names = Counter(p.stem.lstrip('_') for p in SOURCES if p.name != '__init__.py' and p.name != '__main__.py')
    names.update(p.name for p in ROOT.iterdir() if p.is_dir() and (p / '__init__.py').exists())
    shared = sorted(name for name, count in names.items() if count > 1)
    assert not shared, f'module names used twice in the package: {shared}'


def test_no_module_stands_in_for_another() -> None:
    """No alias module: nothing replaces itself in `sys.modules` with a module of another path."""
    for path in SOURCES:
        text = path.read_text(encoding='utf-8')
        assert 'sys.modules[__name__]' not in text, f'{path.relative_to(ROOT)} stands in for another module'


def test_stepcore_backend_gives_every_name_it_lists() -> None:
    backend = importlib.import_module('stepcore.backend')
    assert len(set(backend.__all__)) == len(backend.__all__)
    missing = [name for name in backend.__all__ if not hasattr(backend, name)]
    assert not missing
    assert backend.EngineStore is importlib.import_module('stepcore.engine').EngineStore
