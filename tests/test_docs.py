"""The documentation: its Python examples run, its CLI reference is complete, and the site builds strictly.

Each page's ```python blocks run in order in one namespace, in a fresh working directory, with no
network (the examples use pydantic-ai's TestModel / FunctionModel). A block preceded by an
`<!-- no-run -->` line is shown but not run (excerpts, or code that needs a real server).
Pages written and tested alongside their backend packages are not run here.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main

from stepcore.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / 'docs'
NO_RUN = '<!-- no-run -->'
TESTED_ELSEWHERE = {
    'performance.md',
    'backends/mongo.md',
    'backends/s3.md',
    'backends/postgres.md',
    'backends/redis.md',
}

_FENCE = re.compile(r'^```python[^\n]*\n(.*?)^```\s*$', re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    line: int
    code: str
    run: bool


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding='utf-8')
    found: list[Block] = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip('\n').rsplit('\n', 1)[-1].strip()
        line = text.count('\n', 0, match.start()) + 2
        found.append(Block(line=line, code=match.group(1), run=before != NO_RUN))
    return found


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob('*.md') if p.relative_to(DOCS).as_posix() not in TESTED_ELSEWHERE)


@pytest.mark.parametrize('page', pages(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_python_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # The examples call asyncio.run(); a thread of their own keeps that away from this thread's loop.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(_run_page, page).result()


def _run_page(page: Path) -> None:
    namespace: dict[str, object] = {'__name__': f'docs_{page.stem}'}
    for block in blocks(page):
        filename = f'{page.relative_to(ROOT)}:{block.line}'
        linecache.cache[filename] = (len(block.code), None, block.code.splitlines(True), filename)
        # Every block must at least be valid Python; shown-only excerpts may use top-level `await`.
        flags = 0 if block.run else ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        compiled = compile(block.code, filename, 'exec', flags=flags)
        if block.run:
            exec(compiled, namespace)


def test_only_a_few_examples_are_not_run() -> None:
    everything = [b for p in pages() for b in blocks(p)]
    skipped = [b for b in everything if not b.run]
    assert len(everything) >= 20
    assert len(skipped) <= 5, f'{len(skipped)} examples are marked {NO_RUN}: make them runnable'


def test_cli_reference_names_every_command() -> None:
    reference = (DOCS / 'cli.md').read_text(encoding='utf-8')
    group = typer.main.get_group(app)
    names = sorted(group.list_commands(None))  # pyright: ignore[reportArgumentType]
    assert 'demo' in names
    missing = [name for name in names if f'stepcore {name}' not in reference]
    assert not missing, f'docs/cli.md does not show: {missing}'


def test_site_builds_strictly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith('MKDOCS')}
    result = subprocess.run(
        [sys.executable, '-m', 'mkdocs', 'build', '--strict', '--site-dir', str(tmp_path / 'site')],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / 'site' / 'index.html').exists()
    assert (tmp_path / 'site' / 'cli' / 'index.html').exists()
