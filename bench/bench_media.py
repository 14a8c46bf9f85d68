"""What a media store's put and get cost.

Not a test: run `uv run python bench/bench_media.py [--rounds 7] [--small 300] [--large 20]`.

Each case puts `--small` distinct 1 KiB blobs (or `--large` distinct 1 MiB blobs) into a fresh
media store and reads each one back with `get`: on `DiskMediaStore` (a directory) and on
`SqliteMediaStore` (a database file). Rounds interleave the cases, so a slow moment of the machine
falls on all of them alike; the table gives, per case, the median over rounds of the wall time and
of the process CPU time (all threads) per put and per get.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from media_disk import DiskMediaStore
from step_sqlite import SqliteMediaStore
from stepcore.media import MediaStore

KiB = 1024
MiB = 1024 * KiB


def _blobs(count: int, size: int, salt: int) -> list[bytes]:
    """`count` distinct blobs of `size` bytes (random, so no store can shortcut them)."""
    return [salt.to_bytes(4, 'big') + n.to_bytes(4, 'big') + os.urandom(size - 8) for n in range(count)]


def _disk(folder: Path) -> MediaStore:
    return DiskMediaStore(folder / 'media')


def _sqlite(folder: Path) -> MediaStore:
    return SqliteMediaStore(database=folder / 'media.db')


BACKENDS: dict[str, Callable[[Path], MediaStore]] = {'disk': _disk, 'sqlite': _sqlite}


async def _close(store: MediaStore) -> None:
    close = getattr(store, 'aclose', None)
    if close is not None:
        await close()


async def _timed(work: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    await work()
    return time.perf_counter() - wall, time.process_time() - cpu


async def _case(backend: str, blobs: list[bytes]) -> dict[str, tuple[float, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        store = BACKENDS[backend](Path(tmp))
        await store.put(b'warm-up')  # schema creation and the first connection are not what is measured
        uris: list[str] = []

        async def put_all() -> None:
            for data in blobs:
                uris.append(await store.put(data))

        async def get_all() -> None:
            for uri in uris:
                await store.get(uri)

        put = await _timed(put_all)
        get = await _timed(get_all)
        await _close(store)
    count = len(blobs)
    return {'put': (put[0] / count, put[1] / count), 'get': (get[0] / count, get[1] / count)}


async def main(rounds: int, small: int, large: int) -> None:
    cases = [
        (backend, label, count, size)
        for backend in BACKENDS
        for label, count, size in (
            ('1 KiB', small, KiB),
            ('1 MiB', large, MiB),
        )
    ]
    samples: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for r in range(rounds):
        for backend, label, count, size in cases:
            result = await _case(backend, _blobs(count, size, r))
            for op, sample in result.items():
                samples.setdefault((backend, label, op), []).append(sample)
    print(
        f'{rounds} rounds, {small} blobs of 1 KiB and {large} of 1 MiB per case; '
        f'Python {platform.python_version()}, {os.cpu_count()} CPUs'
    )
    print()
    print('| store | blob | op | wall per op (median) | CPU per op (median) |')
    print('|---|---|---|---:|---:|')
    for (backend, label, op), values in samples.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        print(f'| {backend} | {label} | {op} | {wall * 1e6:,.0f} µs | {cpu * 1e6:,.0f} µs |')


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--small', type=int, default=300, help='1 KiB blobs per case')
    parser.add_argument('--large', type=int, default=20, help='1 MiB blobs per case')
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.small, args.large))
