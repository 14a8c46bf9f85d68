"""The Python examples in docs/backends/postgres.md run, in order, against STEP_POSTGRES_URL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from step_postgres import PostgresStepStore

DOC = Path(__file__).resolve().parents[3] / 'docs' / 'backends' / 'postgres.md'


def python_blocks(text: str) -> list[str]:
    return re.findall(r'```python\n(.*?)```', text, flags=re.DOTALL)


async def test_postgres_doc_examples_run(postgres_url: str, table_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('STEP_POSTGRES_URL', postgres_url)
    blocks = python_blocks(DOC.read_text(encoding='utf-8'))
    assert len(blocks) == 4
    namespace: dict[str, Any] = {'__name__': 'docs_example'}
    opened: list[PostgresStepStore] = []
    ran = 0
    try:
        for block in blocks:
            assert "'myapp'" in block or 'table_prefix' not in block
            exec(compile(block.replace("'myapp'", repr(table_prefix)), str(DOC), 'exec'), namespace)
            opened.extend(v for v in namespace.values() if isinstance(v, PostgresStepStore))
            if 'main' in namespace:
                await namespace.pop('main')()
                ran += 1
    finally:
        for store in {id(s): s for s in opened}.values():
            await store.aclose()
    assert ran == 3
    assert namespace['dsn'] == postgres_url
    spec_store = namespace['store']
    assert isinstance(spec_store, PostgresStepStore)
    assert spec_store.table_prefix == table_prefix
    assert spec_store.max_snapshots_per_run == 20
