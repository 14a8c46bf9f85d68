"""A fork server for tests that SIGKILL real agent runs many times: import once, fork per run.

The server (`serve`, in the zygote process) has already imported stepcore, pydantic-ai and the
backend and warmed them up; it prints `ready`, then reads one JSON job per line on stdin and, for
each, forks a child that runs the job and exits with its status. No event loop, thread or store of
the zygote is alive at the fork: the child shares nothing but what was imported and built. The
server answers each job with one JSON line, `{"exit": code, "killed": bool}` (`exit` is the
child's exit status, or minus the signal that ended it).

The client (`zygote`, in the test) starts the server, waits for `ready`, and sends jobs one at a
time (`Zygote.run`); whatever the processes wrote to stderr is quoted when something fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

__all__ = ('Zygote', 'serve', 'zygote')


def serve(child: Callable[[dict[str, Any]], int]) -> None:
    """Print `ready`, then fork a child per job on stdin and answer its exit status (see the module)."""
    print('ready', flush=True)
    for line in sys.stdin:
        job = cast(dict[str, Any], json.loads(line))
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = child(job)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        print(json.dumps({'exit': code, 'killed': code == -signal.SIGKILL}), flush=True)


class Zygote:
    """The client side of `serve`: one job at a time."""

    def __init__(self, process: asyncio.subprocess.Process, stderr: Path, *, reply_seconds: float) -> None:
        self.process = process
        self.stderr = stderr
        self.reply_seconds = reply_seconds
        """How long one job may take (a guard against a hang, not a performance bound)."""

    def failure(self, what: str) -> str:
        tail = self.stderr.read_text(errors='replace')[-4000:] if self.stderr.exists() else ''
        return f'{what}; the processes wrote:\n{tail}'

    async def line(self) -> bytes:
        assert self.process.stdout is not None
        with anyio.move_on_after(self.reply_seconds):
            return await self.process.stdout.readline()
        pytest.fail(self.failure(f'no answer from the zygote within {self.reply_seconds} s'))

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """Send `job`; the server's answer, `{"exit": code, "killed": bool}`."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(job).encode() + b'\n')
        await self.process.stdin.drain()
        reply = await self.line()
        if not reply:
            pytest.fail(self.failure(f'the zygote exited (status {await self.process.wait()})'))
        return cast(dict[str, Any], json.loads(reply))


@asynccontextmanager
async def zygote(args: Sequence[str], stderr: Path, *, reply_seconds: float) -> AsyncIterator[Zygote]:
    """Start `python *args` (a script calling `serve`), wait for `ready`, and stop it on exit."""
    with stderr.open('wb') as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=errors
        )
    server = Zygote(process, stderr, reply_seconds=reply_seconds)
    try:
        if await server.line() != b'ready\n':
            pytest.fail(server.failure('the zygote did not start'))
        yield server
    finally:
        if process.stdin is not None:
            process.stdin.close()
        with anyio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
