"""What garbage collection of media costs.

Not a test: run `uv run python bench/bench_gc.py [--blobs 10000] [--runs 100] [--rounds 3]`.

A SQLite step store holds `--runs` runs whose snapshots reference half of `--blobs` blobs of
2 KiB (as images); the other half is put straight into the media store and referenced by nothing.
`collect_garbage` then runs a day later (`now=`), so every unreferenced blob is removed: once on
`DiskMediaStore` (a directory) and once on the SQLite store's own `SqliteMediaStore` (its `media`
table). Each round builds everything afresh in a temporary directory; the table gives the median
over rounds of the collection's wall time and process CPU time (all threads), and of a dry run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from pydantic_ai.messages import BinaryContent, ModelRequest, UserPromptPart

from media_disk import DiskMediaStore
from step_sqlite import SqliteStepStore
from stepcore import ContinuableSnapshot, RunRecord, collect_garbage
from stepcore.media import MediaStore
from stepcore.store.models import utcnow

BLOB_BYTES = 2048
THRESHOLD = 1024


def _blob(n: int) -> bytes:
    return n.to_bytes(8, 'big') * (BLOB_BYTES // 8)


async def _fill(store: SqliteStepStore, media: MediaStore, blobs: int, runs: int) -> None:
    binary = cast(Callable[..., BinaryContent], BinaryContent)
    referenced = blobs // 2
    per_run = -(-referenced // runs)
    for r in range(runs):
        numbers = range(r * per_run, min((r + 1) * per_run, referenced))
        if not numbers:
            break
        run_id = f'run-{r}'
        await store.register_run(RunRecord(run_id=run_id))
        images = [binary(data=_blob(n), media_type='image/png') for n in numbers]
        await store.save_snapshot(
            ContinuableSnapshot(
                run_id=run_id, step_index=0, messages=[ModelRequest(parts=[UserPromptPart(['look', *images])])]
            )
        )
    for n in range(referenced, blobs):
        await media.put(_blob(n))


async def _round(kind: str, blobs: int, runs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        media: MediaStore | None = DiskMediaStore(folder / 'media') if kind == 'disk' else None
        options: dict[str, Any] = {'media_threshold_bytes': THRESHOLD}
        if media is not None:
            options['media_store'] = media
        store = SqliteStepStore(database=folder / 'runs.db', **options)
        try:
            used = store.media_store
            assert used is not None
            await _fill(store, used, blobs, runs)
            later = utcnow() + timedelta(days=1)
            wall, cpu = time.perf_counter(), time.process_time()
            dry = await collect_garbage(store, dry_run=True, now=later)
            dry_wall = time.perf_counter() - wall
            wall, cpu = time.perf_counter(), time.process_time()
            report = await collect_garbage(store, now=later)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert dry.removed == report.removed == blobs - blobs // 2, (dry, report)
            assert report.kept_referenced == blobs // 2
        finally:
            await store.aclose()
    return {'wall': wall, 'cpu': cpu, 'dry': dry_wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument('--blobs', type=int, default=10_000)
    parser.add_argument('--runs', type=int, default=100)
    parser.add_argument('--rounds', type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {'disk': [], 'sqlite': []}
    for _ in range(args.rounds):
        for kind in results:  # interleaved, so both see the same machine load
            results[kind].append(asyncio.run(_round(kind, args.blobs, args.runs)))
    print(
        f'{args.blobs} blobs of {BLOB_BYTES} B, half referenced by {args.runs} runs; median of {args.rounds} '
        f'rounds; Python {platform.python_version()}, {os.cpu_count()} CPUs'
    )
    print()
    print('| media store | collect (wall) | collect (CPU) | per blob (wall) | dry run (wall) |')
    print('|---|---|---|---|---|')
    for kind, rounds in results.items():
        wall = statistics.median(r['wall'] for r in rounds)
        cpu = statistics.median(r['cpu'] for r in rounds)
        dry = statistics.median(r['dry'] for r in rounds)
        name = 'DiskMediaStore' if kind == 'disk' else 'SqliteMediaStore'
        print(f'| {name} | {wall:.2f} s | {cpu:.2f} s | {wall / args.blobs * 1e6:.0f} µs | {dry:.2f} s |')


if __name__ == '__main__':
    main()
