"""The Python examples in docs/backends/redis.md run, in order, against STEP_REDIS_URL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from step_redis import RedisStepStore

DOC = Path(__file__).resolve().parents[3] / 'docs' / 'backends' / 'redis.md'


def python_blocks(text: str) -> list[str]:
    return re.findall(r'```python\n(.*?)```', text, flags=re.DOTALL)


async def test_redis_doc_examples_run(redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('STEP_REDIS_URL', redis_url)
    blocks = python_blocks(DOC.read_text(encoding='utf-8'))
    assert len(blocks) == 4
    namespace: dict[str, Any] = {'__name__': 'docs_example'}
    opened: list[RedisStepStore] = []
    ran = 0
    try:
        for block in blocks:
            assert "'myapp'" in block or 'myapp' not in block
            code = block.replace("'myapp'", repr(key_prefix)).replace('key_prefix=myapp', f'key_prefix={key_prefix}')
            exec(compile(code, str(DOC), 'exec'), namespace)
            opened.extend(v for v in namespace.values() if isinstance(v, RedisStepStore))
            if 'main' in namespace:
                await namespace.pop('main')()
                ran += 1
    finally:
        for store in {id(s): s for s in opened}.values():
            await store.aclose()
    assert ran == 3
    assert namespace['url'] == redis_url
    for name in ('store', 'same'):
        built = namespace[name]
        assert isinstance(built, RedisStepStore)
        assert (built.key_prefix, built.max_snapshots_per_run) == (key_prefix, 20)
