"""`stepcore recover --orphans --watch` as a service runs it: a real process, stopped with SIGTERM or SIGINT.

It prints a line per outcome on stdout and, while nothing happens, a short status line on stderr at
each look (none with `--quiet`). Sent SIGTERM while it resumes an orphan, it claims nothing more, lets
that resumption finish, says it stopped, and exits 0. The agent and its store are those of
`test_cli_exit_codes.py` (a real pydantic-ai agent with `StepPersistence`, on SQLite).
"""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_spec = importlib.util.spec_from_file_location('cli_exit_codes', Path(__file__).with_name('test_cli_exit_codes.py'))
assert _spec is not None
assert _spec.loader is not None
_codes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_codes)
World: Any = _codes.World


class Watcher:
    """`stepcore recover --orphans --watch` in a process of its own, its output in files read as it goes."""

    def __init__(self, world: Any, *extra: str) -> None:
        self.out = world.root / 'watch.out'
        self.err = world.root / 'watch.err'
        with self.out.open('wb') as out, self.err.open('wb') as err:
            command = ['recover', '--orphans', '--watch', '--agent', 'cliapp:agent', *extra, '--store', world.url]
            self.process = subprocess.Popen(
                [sys.executable, '-m', 'stepcore.cli', *command],
                cwd=world.root,
                env=world.env(),
                stdout=out,
                stderr=err,
            )

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_for(self, found: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not found():
            assert self.process.poll() is None, f'the watcher ended ({self.process.returncode}): {self.stderr()}'
            assert time.monotonic() < deadline, f'{what} never came: {self.stdout()} {self.stderr()}'
            time.sleep(0.05)

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 60.0) -> int:
        self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Any]:
    made = World(tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_sigterm_lets_the_resumption_under_way_finish_then_exits_0(world: Any) -> None:
    world.orphan('orphan-1')
    (world.root / 'hold').touch()  # the resumption will wait inside the tool
    watcher = Watcher(world, '--interval', '0.3')
    try:
        world.wait_in_tool(watcher.process.pid)
        watcher.process.send_signal(signal.SIGTERM)
        watcher.wait_for(lambda: 'SIGTERM: stopping' in watcher.stderr(), 'the stopping line')
        time.sleep(1.0)
        assert watcher.process.poll() is None, 'it stopped before the resumption it held finished'
        assert 'orphan-1' not in watcher.stdout()
        world.release()
        assert watcher.process.wait(timeout=60) == 0, watcher.stderr()
    finally:
        watcher.close()
    out, err = watcher.stdout(), watcher.stderr()
    assert out.startswith('orphan-1: resumed as '), out
    assert "output 'done: acted 1'" in out
    assert len(out.splitlines()) == 1  # one line per outcome
    assert err.splitlines()[0].startswith(f'watching {world.url} for orphans of worker every 0.3 s')
    assert 'no more runs are claimed, and the resumptions under way finish first' in err
    assert err.splitlines()[-1] == 'stopped on SIGTERM: every resumption under way finished; this worker holds no run'
    assert world.calls() == 2  # the killed run's call, and its resumption's
    ended = world.cli('runs', '--status', 'orphaned', '--json')
    assert ended.exit_code == 0
    assert ended.stdout.strip() == '[]'


def test_idle_status_lines_and_quiet(world: Any) -> None:
    assert world.start('paused-1', kind='approval') == 'paused'
    watcher = Watcher(world, '--interval', '0.2')
    try:
        status = f'watching {world.url}: 0 orphans, 1 waiting, next look within 0.2 s'
        watcher.wait_for(lambda: watcher.stderr().count(status) >= 2, 'two status lines')
        assert watcher.stop(signal.SIGINT) == 0, watcher.stderr()
    finally:
        watcher.close()
    assert watcher.stdout() == ''
    err = watcher.stderr().splitlines()
    assert err[-1] == 'stopped on SIGINT: every resumption under way finished; this worker holds no run'
    assert 'Traceback' not in watcher.stderr()

    quiet = Watcher(world, '--interval', '0.2', '--quiet')
    try:
        quiet.wait_for(lambda: 'watching' in quiet.stderr(), 'the first line')
        time.sleep(1.0)
        assert quiet.stop() == 0, quiet.stderr()
    finally:
        quiet.close()
    lines = quiet.stderr().splitlines()
    assert [line.split(':')[0] for line in lines] == [lines[0].split(':')[0], 'SIGTERM', 'stopped on SIGTERM'], lines
    assert not any('next look' in line for line in lines)


def test_a_second_signal_stops_at_once_and_exits_1(world: Any) -> None:
    world.orphan('orphan-2')
    (world.root / 'hold').touch()
    watcher = Watcher(world, '--interval', '0.3')
    try:
        world.wait_in_tool(watcher.process.pid)
        watcher.process.send_signal(signal.SIGTERM)
        watcher.wait_for(lambda: 'SIGTERM: stopping' in watcher.stderr(), 'the stopping line')
        watcher.process.send_signal(signal.SIGTERM)
        watcher.wait_for(lambda: 'SIGTERM again: stopping at once' in watcher.stderr(), 'the second stopping line')
        world.release()  # the tool's thread is not interrupted: the process ends once it returns
        assert watcher.process.wait(timeout=60) == 1, watcher.stderr()
    finally:
        watcher.close()
    assert 'stopped at once: the resumptions under way were cancelled' in watcher.stderr()
    assert 'Traceback' not in watcher.stderr()
