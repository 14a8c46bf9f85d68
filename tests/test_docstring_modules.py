"""Docstrings name only modules that exist.

A docstring that points a reader at a module (`stepcore.engine._port`, `_rows.py`, `files.Log`)
sends them to open it; after a module is renamed, split or removed, the pointer leads nowhere. Every
docstring under `packages/*/src` and `tests-shared/src` is read with `ast` (those of modules,
classes and functions, and the strings under attributes), and three kinds of names are checked:

- a dotted name rooted at a package of the workspace (`stepcore.store.leases.fencing`): the longest
  prefix that is a module must exist, and the next part must be defined or imported in it. A dotted
  string the code itself uses as a value (a metadata key such as `stepcore.job`) is not a module;
- a file name (`_rows.py`, `engine/_seal.py`): a file of that name in the same package, or at that
  path in the repository;
- a short dotted name in backquotes whose first part is the name of a module of the package
  (`files.Log`, `history.TAIL_RECHECK`): the module beside the docstring's own, or one a folder's
  face hands on under that name (`ops`), must define the second part. A first part the file binds
  itself (a parameter, a variable, an import) is not a module name.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRCS = sorted([*ROOT.glob('packages/*/src'), *ROOT.glob('tests-shared/src')])
PACKAGES = sorted(p for src in SRCS for p in src.iterdir() if (p / '__init__.py').is_file())
SOURCES = sorted(path for package in PACKAGES for path in package.rglob('*.py'))

FILE_SUFFIXES = frozenset({'py', 'tmpl', 'db', 'json', 'jsonl', 'md', 'toml', 'txt', 'bin', 'lock', 'html', 'js'})
"""A short dotted name ending in one of these is a file's name (`runs.db`), checked as a file if at all."""

NOT_OURS = {'conftest.py'}
"""File names that are not modules of the workspace: pytest's per-folder file, which a backend's tests hold."""

_ROOTS = '|'.join(re.escape(p.name) for p in PACKAGES)
_DOTTED = re.compile(rf'(?<![\w.])((?:{_ROOTS})(?:\.\w+)+)')
_FILE = re.compile(r'(?<![\w.*/{}-])((?:[\w.-]+/)*\w+\.py)\b(?!\.tmpl)')
_SHORT = re.compile(r'`([A-Za-z_]\w*)\.(\w+)')


def _module_name(path: Path) -> str:
    src = next(s for s in SRCS if path.is_relative_to(s))
    parts = path.relative_to(src).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES = {_module_name(path): path for path in SOURCES}


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding='utf-8'))


@cache
def _defined(module: str) -> frozenset[str]:
    """The names a module defines or imports at its top level (inside `if` and `try` too)."""
    names: set[str] = set()
    body = list(_tree(MODULES[module]).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split('.')[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):
            body += [*node.body, *node.orelse, *getattr(node, 'finalbody', [])]
            body += [n for h in getattr(node, 'handlers', []) for n in h.body]
    return frozenset(names)


def _dotted_exists(name: str) -> bool:
    parts = name.split('.')
    for end in range(len(parts), 0, -1):
        module = '.'.join(parts[:end])
        if module in MODULES:
            rest = parts[end:]
            return not rest or rest[0] in _defined(module) or f'{module}.{rest[0]}' in MODULES
    return False


@cache
def _values() -> frozenset[str]:
    """Dotted strings the code uses as values (metadata keys, logger names): not module references."""
    found: set[str] = set()
    for path in SOURCES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.fullmatch(node.value):
                found.add(node.value)
    return frozenset(found)


@cache
def _face_aliases(package: str) -> dict[str, str]:
    """Modules a folder's face hands on under a plain name (`ops` for `stepcore.engine._ops`)."""
    aliases: dict[str, str] = {}
    for module, path in MODULES.items():
        if module.split('.')[0] != package or path.name != '__init__.py':
            continue
        for node in _tree(path).body:
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if f'{node.module}.{alias.name}' in MODULES:
                        aliases[alias.asname or alias.name] = f'{node.module}.{alias.name}'
    return aliases


def _bound(tree: ast.Module) -> set[str]:
    """Every name the file binds or reads: a first part among them is a variable, not a module."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split('.')[0] for a in node.names)
    return names


def _short_exists(path: Path, first: str, second: str) -> bool | None:
    """Whether `first.second` names something in a module; `None` when `first` is not a module's name."""
    module = _module_name(path)
    package = module.split('.')[0]
    folder = module if path.name == '__init__.py' else module.rpartition('.')[0]
    for candidate in (f'{folder}.{first}', f'{package}.{first}'):
        if candidate in MODULES:
            return second in _defined(candidate) or f'{candidate}.{second}' in MODULES
    if first in _face_aliases(package):
        target = _face_aliases(package)[first]
        return second in _defined(target) or f'{target}.{second}' in MODULES
    stems = {m.rpartition('.')[2].lstrip('_') for m in MODULES if m.split('.')[0] == package}
    return False if first.lstrip('_') in stems else None


def _file_exists(path: Path, name: str) -> bool:
    if name in NOT_OURS:
        return True
    package = next(p for p in PACKAGES if path.is_relative_to(p))
    if '/' not in name:
        return any(p.name == name for p in package.rglob('*.py'))
    return (ROOT / name).is_file() or any(p.as_posix().endswith('/' + name) for p in package.rglob('*.py'))


def _docstrings(tree: ast.Module) -> Iterator[str]:
    """The docstrings of the module, its classes and functions, and the strings under attributes."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.value.value


def missing_modules(path: Path) -> list[str]:
    """The names of modules (or of things in modules) that the file's docstrings give and that do not exist."""
    tree = _tree(path)
    bound = _bound(tree)
    found: list[str] = []
    for text in _docstrings(tree):
        for match in _DOTTED.finditer(text):
            name = match.group(1)
            if name not in _values() and not _dotted_exists(name):
                found.append(name)
        for match in _FILE.finditer(text):
            if not _file_exists(path, match.group(1)):
                found.append(match.group(1))
        for match in _SHORT.finditer(text):
            first, second = match.groups()
            if second in FILE_SUFFIXES or first in bound or any(first == p.name for p in PACKAGES):
                continue
            if _short_exists(path, first, second) is False:
                found.append(f'{first}.{second}')
    return sorted(set(found))


def _where(path: Path) -> str:
    return path.relative_to(next(s for s in SRCS if path.is_relative_to(s))).as_posix()


def test_there_are_docstrings_to_check() -> None:
    assert len(SOURCES) > 200, len(SOURCES)
    assert {p.name for p in PACKAGES} >= {'stepcore', 'step_file', 'step_sqlite', 'stepcore_conformance'}


@pytest.mark.parametrize('path', SOURCES, ids=_where)
def test_docstrings_name_only_modules_that_exist(path: Path) -> None:
    stale = missing_modules(path)
    assert not stale, f'{_where(path)}: its docstrings name {stale}, which do not exist: name the module as it is now'


def test_the_check_finds_each_kind_of_name() -> None:
    module = ROOT / 'packages' / 'stepcore' / 'src' / 'stepcore' / 'engine' / '_history.py'
    assert missing_modules(module) == []
    assert _dotted_exists('stepcore.engine._port.SyncPort')
    assert not _dotted_exists('stepcore.engine._store')
    assert not _dotted_exists('stepcore.store.leases.with_epoch')
    assert _file_exists(module, '_rows.py')
    assert not _file_exists(module, 'rows.py')
    assert _short_exists(module, 'ops', 'PutEvents') is True
    assert _short_exists(module, 'history', 'TAIL_RECHECK') is False
    assert _short_exists(module, 'delta', 'walked') is None
