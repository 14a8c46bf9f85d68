"""The Python examples in docs/backends/mongo.md run, in order, against STEP_MONGO_URL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from step_mongo import MongoMediaStore, MongoStepStore

DOC = Path(__file__).resolve().parents[3] / 'docs' / 'backends' / 'mongo.md'


def python_blocks(text: str) -> list[str]:
    return re.findall(r'```python\n(.*?)```', text, flags=re.DOTALL)


async def test_mongo_doc_examples_run(mongo_url: str, db_name: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv('STEP_MONGO_URL', mongo_url)
    blocks = python_blocks(DOC.read_text(encoding='utf-8'))
    assert len(blocks) >= 3
    namespace: dict[str, Any] = {'__name__': 'docs_example'}
    opened: list[MongoStepStore | MongoMediaStore] = []
    try:
        for block in blocks:
            exec(compile(block.replace("'agents'", repr(db_name)), str(DOC), 'exec'), namespace)
            opened.extend(v for v in namespace.values() if isinstance(v, MongoStepStore | MongoMediaStore))
            if 'main' in namespace:
                await namespace.pop('main')()
    finally:
        for store in {id(s): s for s in opened}.values():
            await store.aclose()
    assert namespace['url'] == mongo_url
    assert isinstance(namespace['store'], MongoStepStore)
    assert namespace['store'].database_name == db_name
