"""The zygote of the SIGKILL crash test: `python -m stepcore_conformance._crash_zygote '<store_spec json>'`.

It imports stepcore, pydantic-ai and the backend once and runs the agent once on an in-memory
store (pydantic-ai and pydantic build much of what a run needs on first use: done here, once),
prints `ready`, then reads one job per line on stdin, `{"k": <int>, "run_id": <str>}`. For each
it forks a child (no event loop, thread or store of the zygote is alive then: the child shares
nothing but what was imported and built) that opens the store from the spec, installs a fault
hook that SIGKILLs the child at its `k`-th write boundary (0-based), and runs the agent: one tool
cycle of two parallel calls (`fast` and `slow`), then a final answer.
The zygote answers each job with one JSON line, `{"exit": code, "killed": bool}` (see
`stepcore_conformance.forkserver`, which does the forking).
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from typing import Any, cast

from stepcore.backend import get_registry, load_factory

from ._crash_agent import agent_run
from .forkserver import serve

__all__ = ('main',)


def _child(spec: dict[str, Any], job: dict[str, Any]) -> int:
    try:
        asyncio.run(agent_run(spec, int(job['k']), str(job['run_id'])))
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str]) -> None:
    spec = cast(dict[str, Any], json.loads(argv[1]))
    backend = get_registry().get('step', str(spec.get('backend', 'memory')))
    load_factory(backend.info.factory)  # import the backend once, here, not in every child
    asyncio.run(agent_run(None, -1, 'warm-up'))
    serve(lambda job: _child(spec, job))


if __name__ == '__main__':
    main(sys.argv)
