"""The zygote of the SIGKILL crash test: `python -m stepcore_conformance._crash_zygote '<store_spec json>'`.

It imports stepcore, pydantic-ai and the backend once and runs the agent once on an in-memory
store (pydantic-ai and pydantic build much of what a run needs on first use: done here, once),
prints `ready`, then reads one job per line on stdin, `{"k": <int>, "run_id": <str>}`. For each
it forks a child (no event loop, thread or store of the zygote is alive then: the child shares
nothing but what was imported and built) that opens the store from the spec, installs a fault
hook that SIGKILLs the child at its `k`-th write boundary (0-based), and runs the agent: one tool
cycle of two parallel calls (`fast` and `slow`), then a final answer.
The zygote answers each job with one JSON line: `{"k": k, "killed": bool, "exit": code}` (`exit`
is the child's exit status, or minus the signal that ended it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import traceback
from typing import Any, cast

from stepcore.plugins.registry import get_registry, load_factory

from ._crash_agent import agent_run

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
    print('ready', flush=True)
    for line in sys.stdin:
        job = cast(dict[str, Any], json.loads(line))
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(spec, job)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        print(json.dumps({'k': job['k'], 'killed': code == -signal.SIGKILL, 'exit': code}), flush=True)


if __name__ == '__main__':
    main(sys.argv)
