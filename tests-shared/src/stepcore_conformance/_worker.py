"""A writer process for the cross-process tests: `python -m stepcore_conformance._worker '<json>'`.

The JSON object holds `spec` (keyword arguments of `stepcore.from_spec`), `run_id`, `tag`,
`events` and `snapshots`. The worker appends `events` events and saves `snapshots` growing
snapshots tagged with `tag`, then closes its store.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

import stepcore

from ._support import conversation, event, snapshot


async def write(job: dict[str, Any]) -> None:
    store = stepcore.from_spec(**job['spec'])
    run_id: str = job['run_id']
    tag: str = job['tag']
    try:
        for n in range(int(job['snapshots'])):
            await store.save_snapshot(
                snapshot(run_id, conversation(n, tag=tag), step_index=n, metadata={'writer': tag})
            )
        for n in range(int(job['events'])):
            await store.append_event(event(run_id, n, metadata={'writer': tag, 'i': str(n)}))
    finally:
        await store.aclose()


def main(argv: list[str]) -> None:
    anyio.run(write, json.loads(argv[1]))


if __name__ == '__main__':
    main(sys.argv)
