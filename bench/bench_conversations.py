"""Listing and search over many conversation heads in one SQLite database.

Not a test: run `uv run python bench/bench_conversations.py [--n 100000]`. It saves N short
conversations through `SqliteConversationStore.save`, then times the first page of `listing()`, a
deep page, a selective search (one match), a broad search (many matches) and a two-character
search, each repeated and reported as the median.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_sqlite.conversations import ConversationSummary, SqliteConversationStore

WORDS = ['river', 'mountain', 'lantern', 'harbour', 'orchard', 'compass', 'meadow', 'glacier', 'canyon', 'prairie']


def conversation(i: int) -> list[ModelMessage]:
    topic = WORDS[i % len(WORDS)]
    return [
        ModelRequest(parts=[UserPromptPart(f'Tell me about the {topic} number {i} and its history.')]),
        ModelResponse(parts=[TextPart(f'The {topic} #{i} is well known; ticket code QX{i:06d}.')]),
    ]


async def timed(fn, repeat: int = 7) -> float:  # type: ignore[no-untyped-def]
    samples: list[float] = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / 'conversations.db'
        store = SqliteConversationStore(database=db)
        start = time.perf_counter()
        for i in range(n):
            await store.save(summary=ConversationSummary(conversation_id=f'conv-{i:06d}'), messages=conversation(i))
        fill = time.perf_counter() - start
        size = sum(p.stat().st_size for p in Path(tmp).iterdir())

        rows = [
            ('save (mean per conversation)', fill / n * 1000, ''),
            ('listing, first page of 50', await timed(lambda: store.listing(limit=50)) * 1000, ''),
            ('listing, page at offset n/2', await timed(lambda: store.listing(limit=50, offset=n // 2)) * 1000, ''),
        ]
        for label, query in (
            ('search, one match', f'qx{n // 3:06d}'),
            ('search, 10% match (first page)', 'lantern'),
            ('search, short query (scan)', 'zz'),
        ):
            hits = len(await store.listing(query=query, limit=50))
            ms = await timed(lambda q=query: store.listing(query=q, limit=50)) * 1000
            rows.append((label, ms, f'{hits} on page'))
        await store.aclose()

    print(f'{n:,} conversations, database {size / 1e6:.1f} MB, filled in {fill:.1f} s\n')
    print('| operation | median ms | note |')
    print('|---|---:|---|')
    for label, ms, note in rows:
        print(f'| {label} | {ms:.2f} | {note} |')


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--n', type=int, default=100_000, help='number of conversations (default 100000)')
    anyio.run(main, parser.parse_args().n)
