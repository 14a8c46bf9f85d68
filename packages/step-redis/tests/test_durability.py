"""With the append-only file on, every write a store saw return survives a SIGKILLed server.

The test runs a Redis server of its own (the `redis-server` on PATH, or `REDIS_SERVER`) configured
as docs/backends/redis.md recommends, kills it with SIGKILL right after the writes return, starts
it again on the same append-only file and reads everything back through a new store. (A killed
server process loses nothing with `appendfsync everysec` either; `always` is what also covers a
power loss, which a test cannot stage.)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from step_redis import RedisStepStore
from stepcore import RunRecord, ToolEffectRecord, ToolEffectStatus
from stepcore_conformance.support import check_tool_steps, write_tool_steps

START_GUARD_SECONDS = 30
"""How long a server may take to answer PING (a guard against a hang, not a performance bound)."""


def _server_binary() -> str:
    found = os.environ.get('REDIS_SERVER') or shutil.which('redis-server')
    if not found:
        pytest.fail(
            "this test runs a redis-server of its own and found none: install Debian's redis-server package "
            '(scripts/redis-server.sh start does) or set REDIS_SERVER to the binary'
        )
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return int(s.getsockname()[1])


class _Server:
    """A redis-server on loopback whose data lives in `directory`, started and killed by the test."""

    def __init__(self, directory: Path) -> None:
        self.port = _free_port()
        self.url = f'redis://127.0.0.1:{self.port}/0'
        self.command = [
            _server_binary(),
            '--bind', '127.0.0.1', '--port', str(self.port), '--dir', str(directory),
            '--appendonly', 'yes', '--appendfsync', 'always', '--save', '',
        ]  # fmt: skip
        self.log = directory / 'server.log'
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open('ab') as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_GUARD_SECONDS
        while True:
            try:
                with redis.Redis.from_url(self.url, socket_connect_timeout=1) as client:
                    if client.ping():
                        return
            except redis.ConnectionError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f'redis-server did not start: {self.log.read_text(errors="replace")[-2000:]}')
            time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[_Server]:
    server = _Server(tmp_path)
    try:
        yield server
    finally:
        server.kill()


async def test_writes_returned_before_the_server_was_killed_are_all_there(server: _Server) -> None:
    server.start()
    async with RedisStepStore(url=server.url) as store:
        await write_tool_steps(store, 'durable', 6, conversation_id='conv')
        await store.register_run(RunRecord(run_id='in-flight', conversation_id='conv'))
        await store.record_tool_effect(
            ToolEffectRecord(run_id='in-flight', tool_call_id='call', tool_name='t', status=ToolEffectStatus.STARTED)
        )
    server.kill()
    server.start()
    async with RedisStepStore(url=server.url) as store:
        assert [r.run_id for r in await store.list_runs(conversation_id='conv')] == ['durable', 'in-flight']
        await check_tool_steps(store, 'durable', 6)
        assert [e.tool_call_id for e in await store.list_unresolved_tool_effects('in-flight')] == ['call']
