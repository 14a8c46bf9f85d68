"""The commands that take `--agent` and a store refuse when the agent keeps its runs elsewhere.

An agent module (`dba_app`, written into each test's folder) records its runs in `approvals.db`. A
run of it pauses on a call needing approval, or is killed inside its tool (an orphan). Then
`stepcore resume` and `stepcore recover --orphans` are pointed at a copy of that database
(`shutil.copy`: same store id, another file) and at another database: each exits 1 naming both
stores, and neither database changed (the same runs, the same leases). Pointed at the agent's own
store, by another path to the same file, they resume as before; and an agent module that opens the
store the command line names (`$STEPCORE_STORE`) resumes the run in the copy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from step_sqlite import SqliteStepStore
from stepcore import RunRecord

APP = textwrap.dedent(
    '''
    """The agent of these tests: it records its runs in approvals.db (in the current directory).

    `python dba_app.py RUN` starts a run. DBA_KIND `approval`: the model calls `drop_table`, which
    needs approval (the run pauses); `rerun`: it calls `act`, which waits while a `hold` file is
    there and is run again by recovery.
    """

    import asyncio
    import os
    import sys
    import time
    from pathlib import Path

    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.tools import DeferredToolRequests

    from step_sqlite import SqliteStepStore
    from stepcore import StepPersistence, recovery_policy

    HERE = Path(__file__).parent
    KIND = os.environ.get('DBA_KIND', 'approval')


    def model(messages, info):
        returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f'done: {returned[-1].content}')])
        tool = 'drop_table' if KIND == 'approval' else 'act'
        return ModelResponse(parts=[ToolCallPart(tool, {'name': 'users'}, tool_call_id='call-1')])


    def build(store):
        built = Agent(
            FunctionModel(model),
            name='dba',
            output_type=[str, DeferredToolRequests],
            capabilities=[StepPersistence(store=store, lease_ttl=30.0)],
        )

        @built.tool_plain(requires_approval=True)
        def drop_table(name: str) -> str:
            return f'dropped {name}'

        @built.tool_plain
        @recovery_policy('rerun')
        def act(name: str) -> str:
            (HERE / 'in-tool').write_text(str(os.getpid()))
            deadline = time.monotonic() + 120
            while (HERE / 'hold').exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            return f'acted on {name}'

        return built


    store = SqliteStepStore('approvals.db')
    agent = build(store)


    async def _start(run_id):
        try:
            result = await agent.run('drop the users table', run_id=run_id)
            print(result.output if isinstance(result.output, str) else 'paused', flush=True)
        finally:
            await store.aclose()


    if __name__ == '__main__':
        asyncio.run(_start(sys.argv[1]))
    '''
)

ENV_APP = textwrap.dedent(
    '''
    """The same agent, on the store the command line names (`$STEPCORE_STORE`)."""

    import os

    import stepcore
    from dba_app import build

    agent = build(stepcore.open_store(os.environ['STEPCORE_STORE']))
    '''
)

BARE_APP = textwrap.dedent(
    '''
    """An agent without StepPersistence."""

    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    agent = Agent(TestModel(), name='dba')
    '''
)

OWN_APP = textwrap.dedent(
    '''
    """The same agent, on a store class of one's own written to the contract's methods: no store id."""

    from dba_app import build
    from step_sqlite import SqliteStepStore


    class MyStore:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            if name in ('store_identity', 'store_location'):
                raise AttributeError(name)
            return getattr(self.inner, name)


    for _name in (
        'register_run', 'get_run', 'list_runs', 'append_event', 'list_events', 'save_snapshot',
        'latest_snapshot', 'record_tool_effect', 'get_tool_effect', 'list_unresolved_tool_effects',
    ):
        def _forward(self, *args, _name=_name, **kwargs):
            return getattr(self.inner, _name)(*args, **kwargs)

        setattr(MyStore, _name, _forward)

    agent = build(MyStore(SqliteStepStore('approvals.db')))
    '''
)

PYTHON_WORDS = ('Error', 'Traceback', 'same_store', 'store_identity', 'check_agent_stores', 'StepStore')
"""What no error line of the command line may say: it speaks of commands, flags and stores."""

NEVER = datetime(1970, 1, 1, tzinfo=UTC)


class World:
    """A test's folder: the agent modules, approvals.db, and the commands run on them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / 'dba_app.py').write_text(APP)
        (root / 'env_app.py').write_text(ENV_APP)
        (root / 'bare_app.py').write_text(BARE_APP)
        (root / 'own_app.py').write_text(OWN_APP)
        self.children: list[subprocess.Popen[bytes]] = []

    def env(self, kind: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if k not in ('STEPCORE_STORE', 'STEPCORE_DEBUG')}
        return {**base, 'DBA_KIND': kind, 'COLUMNS': '200'}

    def start(self, run_id: str, kind: str = 'approval') -> str:
        """Run the agent in a process of its own until it ends or pauses; its last line."""
        done = subprocess.run(
            [sys.executable, 'dba_app.py', run_id],
            cwd=self.root,
            env=self.env(kind),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    def orphan(self, run_id: str) -> None:
        """A run whose process was killed inside its tool: its owner is gone."""
        (self.root / 'hold').touch()
        child = subprocess.Popen(
            [sys.executable, 'dba_app.py', run_id], cwd=self.root, env=self.env('rerun'), stdout=subprocess.DEVNULL
        )
        self.children.append(child)
        marker = self.root / 'in-tool'
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text() == str(child.pid)):
            assert time.monotonic() < deadline, 'the run never reached its tool'
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
        (self.root / 'hold').unlink()

    def stepcore(self, *args: str, kind: str = 'approval') -> subprocess.CompletedProcess[str]:
        """`stepcore ARGS` in a process of its own, in the test's folder (as `--agent dba_app:agent` needs)."""
        return subprocess.run(
            [sys.executable, '-m', 'stepcore.cli', *args],
            cwd=self.root,
            env=self.env(kind),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def copy(self, name: str) -> Path:
        """A copy of approvals.db, its write-ahead log folded in first (as a backup tool would)."""
        with sqlite3.connect(self.root / 'approvals.db') as connection:
            connection.execute('PRAGMA wal_checkpoint(TRUNCATE)')
        connection.close()
        return Path(shutil.copy(self.root / 'approvals.db', self.root / name))

    def state(self, database: str, run_id: str) -> tuple[Any, ...]:
        """What a database holds for these tests: its runs, and the run's lease and events."""

        async def read() -> tuple[Any, ...]:
            store = SqliteStepStore(self.root / database)
            try:
                lease = await store.get_lease(run_id)
                return (
                    await store.list_runs(),
                    None if lease is None else dataclasses.replace(lease, checked_at=NEVER),
                    await store.list_events(run_id),
                )
            finally:
                await store.aclose()

        return asyncio.run(read())

    def close(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.wait()


@pytest.fixture
def world(tmp_path: Path) -> Any:
    made = World(tmp_path)
    try:
        yield made
    finally:
        made.close()


def said(result: subprocess.CompletedProcess[str]) -> str:
    return ' '.join(result.stderr.split())


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """`result` exited 1 with one error line holding each of `words`, and no Python; that line."""
    line = said(result)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert line.startswith('error: '), result.stderr
    assert line.count('error: ') == 1, result.stderr
    for word in words:
        assert word in line, (word, line)
    for python in PYTHON_WORDS:
        assert python not in line, (python, line)
    return line


def test_resume_refuses_a_copy_of_the_agents_store_and_changes_nothing(world: World) -> None:
    assert world.start('ops-1') == 'paused'
    approved = world.stepcore('answer', 'ops-1', 'call-1', '--approve', '-s', 'sqlite:///approvals.db')
    assert approved.returncode == 0, approved.stderr
    world.copy('copy.db')
    before = {name: world.state(name, 'ops-1') for name in ('approvals.db', 'copy.db')}
    assert before['approvals.db'] == before['copy.db']

    result = world.stepcore('resume', 'ops-1', '-s', 'sqlite:///copy.db', '--agent', 'dba_app:agent')
    line = refused(
        result,
        'cannot resume run ops-1',
        f"the store of --agent dba_app:agent (database '{world.root / 'approvals.db'}')",
        f"the store --store names (database '{world.root / 'copy.db'}')",
        'two copies of one store',
        'Nothing was changed',
        '-s/--store',
        '$STEPCORE_STORE',
    )
    assert 'resumed' not in result.stdout, line
    after = {name: world.state(name, 'ops-1') for name in ('approvals.db', 'copy.db')}
    assert after == before, 'a refused resume changed a store'


def test_resume_refuses_another_database(world: World) -> None:
    assert world.start('ops-2') == 'paused'
    assert world.stepcore('answer', 'ops-2', 'call-1', '--approve', '-s', 'sqlite:///approvals.db').returncode == 0

    async def other_database() -> None:
        async with SqliteStepStore(world.root / 'other.db') as other:
            await other.register_run(RunRecord(run_id='ops-2', agent_name='dba'))

    asyncio.run(other_database())
    before = {name: world.state(name, 'ops-2') for name in ('approvals.db', 'other.db')}

    result = world.stepcore('resume', 'ops-2', '-s', 'sqlite:///other.db', '--agent', 'dba_app:agent')
    refused(
        result,
        f"(database '{world.root / 'approvals.db'}')",
        f"(database '{world.root / 'other.db'}')",
        'are different stores (store ids',
        'Nothing was changed',
    )
    assert {name: world.state(name, 'ops-2') for name in ('approvals.db', 'other.db')} == before


def test_the_agents_own_store_resumes_by_any_path_to_it(world: World) -> None:
    assert world.start('ops-3') == 'paused'
    assert world.stepcore('answer', 'ops-3', 'call-1', '--approve', '-s', 'sqlite:///approvals.db').returncode == 0
    (world.root / 'elsewhere').mkdir()
    (world.root / 'elsewhere' / 'link.db').symlink_to(world.root / 'approvals.db')
    # an absolute path through a symbolic link, where the agent module opens a relative one
    result = world.stepcore(
        'resume', 'ops-3', '-s', f'sqlite:///{world.root}/elsewhere/link.db', '--agent', 'dba_app:agent'
    )
    assert result.returncode == 0, result.stderr
    assert 'ops-3: resumed as' in ' '.join(result.stdout.split())
    assert 'done: dropped users' in result.stdout
    assert result.stderr == ''


def test_an_agent_module_opening_the_given_store_resumes_the_copy(world: World) -> None:
    assert world.start('ops-4') == 'paused'
    assert world.stepcore('answer', 'ops-4', 'call-1', '--approve', '-s', 'sqlite:///approvals.db').returncode == 0
    world.copy('copy.db')
    original = world.state('approvals.db', 'ops-4')

    result = world.stepcore('resume', 'ops-4', '-s', 'sqlite:///copy.db', '--agent', 'env_app:agent')
    assert result.returncode == 0, result.stderr
    assert 'done: dropped users' in result.stdout
    resumed = world.state('copy.db', 'ops-4')[1]
    assert resumed is not None
    assert resumed.resumed_by in {run.run_id for run in world.state('copy.db', 'ops-4')[0]}
    assert world.state('approvals.db', 'ops-4') == original  # the copy was resumed, not the original


def test_an_agent_without_step_persistence_is_refused(world: World) -> None:
    assert world.start('ops-5') == 'paused'
    before = world.state('approvals.db', 'ops-5')
    result = world.stepcore('resume', 'ops-5', '-s', 'sqlite:///approvals.db', '--agent', 'bare_app:agent')
    refused(result, '--agent bare_app:agent has no StepPersistence', 'cannot resume run ops-5')
    assert world.state('approvals.db', 'ops-5') == before


def test_recover_orphans_refuses_a_copy_and_resumes_on_the_agents_store(world: World) -> None:
    world.orphan('ingest-1')
    world.copy('copy.db')
    before = {name: world.state(name, 'ingest-1') for name in ('approvals.db', 'copy.db')}
    assert before['approvals.db'][1].state == 'running'  # an orphan: its owner was killed

    result = world.stepcore('recover', '--orphans', '-s', 'sqlite:///copy.db', '--agent', 'dba_app:agent', kind='rerun')
    refused(
        result,
        'cannot resume the orphaned runs of this store',
        f"the store of --agent dba_app:agent (database '{world.root / 'approvals.db'}')",
        f"the store --store names (database '{world.root / 'copy.db'}')",
        'two copies of one store',
    )
    assert result.stdout == ''
    assert {name: world.state(name, 'ingest-1') for name in ('approvals.db', 'copy.db')} == before

    recovered = world.stepcore(
        'recover', '--orphans', '-s', 'sqlite:///approvals.db', '--agent', 'dba_app:agent', kind='rerun'
    )
    assert recovered.returncode == 0, recovered.stderr
    assert 'ingest-1: resumed as' in recovered.stdout
    assert world.state('copy.db', 'ingest-1') == before['copy.db']


def test_a_store_without_an_id_is_warned_about_and_the_command_goes_on(world: World) -> None:
    assert world.start('ops-6') == 'paused'
    result = world.stepcore('recover', '--orphans', '-s', 'sqlite:///approvals.db', '--agent', 'own_app:agent')
    assert result.returncode == 0, result.stderr
    assert 'no orphaned runs' in result.stdout
    line = said(result)
    assert line.startswith(
        'warning: cannot tell whether the store of --agent own_app:agent (a MyStore) and the store '
    ), line
    assert f"(database '{world.root / 'approvals.db'}') are one store" in line
    assert 'keeps no store id: the command goes on as if they were one' in line
