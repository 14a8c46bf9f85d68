"""Every command's exit status, through the real entry point, on a real SQLite store.

0 done (or nothing left to do), 1 failed or refused, 2 a usage error, 3 another process owns or
claimed the run, 4 the run waits for a person. The runs are made by a real pydantic-ai agent with
`StepPersistence` (the module `APP` below, written into each test's folder): run in a process of its
own that pauses on a call needing approval, is killed inside its tool (an orphan), or is still
running; the commands that resume runs import it with `--agent cliapp:agent` in a process of their
own, as an operator runs them. Errors name commands and flags, never Python.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from stepcore.cli import app

APP = textwrap.dedent(
    '''
    """The agent of the command-line tests (`--agent cliapp:agent`; `python cliapp.py RUN` starts a run).

    CLIAPP_STORE is the store URL; in the folder CLIAPP_WORLD, `calls.txt` gets a line for each call of
    the tool, `in-tool` holds the pid of the process inside it, and while a `hold` file is there the
    tool waits. CLIAPP_KIND: `rerun` (a recovery policy re-runs the tool), `ask` (a person settles
    it), `approval` (the call needs approval). CLIAPP_FAIL: the tool raises. CLIAPP_GO: a file to wait
    for at import.
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

    import stepcore
    from stepcore import StepPersistence, recovery_policy

    WORLD = Path(os.environ['CLIAPP_WORLD'])
    KIND = os.environ.get('CLIAPP_KIND', 'rerun')

    if os.environ.get('CLIAPP_GO'):
        while not Path(os.environ['CLIAPP_GO']).exists():
            time.sleep(0.002)


    def model(messages, info):
        returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f'done: {returned[-1].content}')])
        return ModelResponse(parts=[ToolCallPart('act', {'n': 1}, tool_call_id='call-1')])


    store = stepcore.open_store(os.environ['CLIAPP_STORE'])
    agent = Agent(
        FunctionModel(model),
        name='worker',
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store=store, lease_ttl=float(os.environ.get('CLIAPP_TTL', '30')))],
    )


    def act(n: int) -> str:
        with (WORLD / 'calls.txt').open('a') as f:
            f.write(f'{os.getpid()}\\n')
        (WORLD / 'in-tool').write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while (WORLD / 'hold').exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if os.environ.get('CLIAPP_FAIL'):
            raise RuntimeError('the printer is on fire')
        return f'acted {n}'


    if KIND == 'approval':
        agent.tool_plain(requires_approval=True)(act)
    elif KIND == 'ask':
        agent.tool_plain(act)
    else:
        agent.tool_plain(recovery_policy('rerun')(act))


    async def _start(run_id):
        try:
            result = await agent.run('act once', run_id=run_id)
            print(result.output if isinstance(result.output, str) else 'paused', flush=True)
        finally:
            await store.aclose()


    if __name__ == '__main__':
        asyncio.run(_start(sys.argv[1]))
    '''
)

PYTHON_WORDS = ('force=True', 'resolve_run', 'resume_run', 'approve_call', 'supply_result', 'Error:', 'Error(')
"""What no error line of the command line may say (it speaks of commands and flags)."""

OK, FAILED, USAGE, REFUSED, WAITING = 0, 1, 2, 3, 4


class World:
    """A test's folder: the agent module, its store, and the commands run on them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f'sqlite:///{root / "runs.db"}'
        (root / 'cliapp.py').write_text(APP)
        self._children: list[subprocess.Popen[bytes]] = []

    def env(self, kind: str = 'rerun', **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if k not in ('STEPCORE_STORE', 'STEPCORE_DEBUG')}
        return {
            **base,
            'CLIAPP_STORE': self.url,
            'CLIAPP_WORLD': str(self.root),
            'CLIAPP_KIND': kind,
            'COLUMNS': '200',
            **extra,
        }

    def start(self, run_id: str, kind: str = 'rerun') -> str:
        """Run the agent to its end (or pause) in a process of its own; its output."""
        done = subprocess.run(
            [sys.executable, 'cliapp.py', run_id],
            cwd=self.root,
            env=self.env(kind),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    def start_held(self, run_id: str, kind: str = 'rerun') -> subprocess.Popen[bytes]:
        """Start a run whose process waits inside its tool (until `release`), holding the run."""
        (self.root / 'hold').touch()
        (self.root / 'in-tool').unlink(missing_ok=True)
        child = subprocess.Popen(
            [sys.executable, 'cliapp.py', run_id], cwd=self.root, env=self.env(kind), stdout=subprocess.DEVNULL
        )
        self._children.append(child)
        self.wait_in_tool(child.pid)
        return child

    def wait_in_tool(self, pid: int, timeout: float = 60.0) -> None:
        marker = self.root / 'in-tool'
        deadline = time.monotonic() + timeout
        while not (marker.exists() and marker.read_text() == str(pid)):
            assert time.monotonic() < deadline, f'process {pid} never reached the tool'
            time.sleep(0.02)

    def orphan(self, run_id: str, kind: str = 'rerun') -> None:
        """A run whose process was killed inside its tool: an orphan (its owner is gone)."""
        child = self.start_held(run_id, kind)
        child.send_signal(signal.SIGKILL)
        child.wait()
        self.release()

    def release(self) -> None:
        (self.root / 'hold').unlink(missing_ok=True)

    def calls(self) -> int:
        path = self.root / 'calls.txt'
        return len(path.read_text().splitlines()) if path.exists() else 0

    def stepcore(self, *args: str, kind: str = 'rerun', **env: str) -> subprocess.CompletedProcess[str]:
        """`stepcore ARGS --store URL` in a process of its own (as `--agent cliapp:agent` needs)."""
        return subprocess.run(
            [sys.executable, '-m', 'stepcore.cli', *args, '--store', self.url],
            cwd=self.root,
            env=self.env(kind, **env),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def cli(self, *args: str) -> Any:
        """`stepcore ARGS --store URL` in this process, through typer's runner."""
        return CliRunner().invoke(app, [*args, '--store', self.url], env={'COLUMNS': '200', 'STEPCORE_DEBUG': ''})

    def close(self) -> None:
        self.release()
        for child in self._children:
            if child.poll() is None:
                child.kill()
            child.wait()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = World(tmp_path)
    try:
        yield made
    finally:
        made.close()


def code(result: Any) -> int:
    return result.returncode if isinstance(result, subprocess.CompletedProcess) else result.exit_code


def stderr(result: Any) -> str:
    return ' '.join(str(result.stderr).split())


def stdout(result: Any) -> str:
    return ' '.join(str(result.stdout).split())


def expect(result: Any, status: int, *said: str, where: str = 'stderr') -> None:
    """`result` ended with `status` and printed each of `said` (on `where`); an error line speaks no Python."""
    text = stderr(result) if where == 'stderr' else stdout(result)
    assert code(result) == status, (code(result), result.stdout, result.stderr)
    for words in said:
        assert words in text, (words, text)
    if status in (FAILED, REFUSED):
        assert stderr(result).startswith('error: '), result.stderr
        assert stderr(result).count('error: ') == 1, result.stderr
    for python in PYTHON_WORDS:
        assert python not in stderr(result), (python, result.stderr)
    assert 'Traceback' not in str(result.stderr)


# --- the reading commands: 0, 1 and 2 -------------------------------------------------------------------


def test_reading_commands(world: World) -> None:
    assert world.start('done-1') == 'done: acted 1'
    for args in (
        ['runs'],
        ['runs', '--status', 'completed', '--json'],
        ['show', 'done-1'],
        ['events', 'done-1'],
        ['tree', 'done-1'],
        ['snapshots', 'done-1'],
        ['effects', 'done-1'],
        ['job', 'done-1'],
        ['export', 'done-1'],
        ['prune', '--older-than', '30d', '--dry-run'],
        ['check'],
    ):
        expect(world.cli(*args), OK)
    for args, said in (
        (['runs', '--status', 'done'], "status 'done' is not a run status"),
        (['runs', '--after', 'last week'], "--after 'last week' is neither a date nor an age"),
        (['show', 'no-such-run'], "run 'no-such-run' not found in this store"),
        (['events', 'no-such-run'], "run 'no-such-run' not found in this store"),
        (['tree', 'no-such-run'], "run 'no-such-run' not found"),
        (['job', 'no-such-job'], "the store has no job 'no-such-job': list the runs with `stepcore runs`"),
        (['prune', '--older-than', 'soon'], "--older-than 'soon' is not a duration"),
        (['show', 'done-1', '--seq', '999'], 'has no snapshot with seq 999'),
    ):
        expect(world.cli(*args), FAILED, said)
    for args in (
        ['runs', '--limit', '0'],
        ['runs', '--no-such-option'],
        ['show'],
        ['events'],
        ['job'],
        ['prune'],
        ['recover', '--orphans', '--interval', 'often'],
        ['resume', 'done-1'],
        ['cancel', 'done-1'],
        ['answer', 'done-1'],
    ):
        assert code(world.cli(*args)) == USAGE, args
    assert code(CliRunner().invoke(app, ['no-such-command'])) == USAGE
    expect(CliRunner().invoke(app, ['plugins']), OK)


# --- a run paused on a call that needs approval -----------------------------------------------------------


def test_a_paused_run_waits_for_a_person_until_answered(world: World) -> None:
    assert world.start('paused-1', kind='approval') == 'paused'
    listed = world.cli('runs', '--status', 'waiting')
    expect(listed, OK, 'paused-1', 'waiting for answers', '1 call', where='stdout')
    told = world.cli('recover', 'paused-1')
    expect(told, WAITING, 'act (call-1) needs approval', '`stepcore answer paused-1 CALL --approve', where='stdout')
    assert code(world.cli('recover', 'paused-1', '--json')) == WAITING
    waits = world.stepcore('resume', 'paused-1', '--agent', 'cliapp:agent', kind='approval')
    expect(
        waits, WAITING, 'run paused-1 waits for answers to deferred tool calls: act (call-1, approval)', where='stdout'
    )
    assert '`stepcore answer paused-1 CALL --approve`' in stdout(waits)
    assert world.calls() == 0

    expect(
        world.cli('answer', 'paused-1', 'call-1', '--result', '"done"'),
        FAILED,
        'it waits for an approval, not for this; use --approve or --deny',
    )
    expect(world.cli('answer', 'paused-1', 'call-9', '--approve'), FAILED, "waits on no tool call 'call-9'")
    expect(world.cli('answer', 'paused-1', 'call-1'), FAILED, 'give exactly one of --approve, --deny')
    approved = world.cli('answer', 'paused-1', 'call-1', '--approve', '--by', 'alice')
    expect(approved, OK, 'approved by alice', 'resume it with `stepcore resume paused-1', where='stdout')
    expect(world.cli('recover', 'paused-1'), OK, 'every call is answered', where='stdout')
    expect(world.cli('answer', 'paused-1', 'call-1', '--deny'), FAILED, 'was already answered: approved by alice')

    resumed = world.stepcore('resume', 'paused-1', '--agent', 'cliapp:agent', kind='approval')
    expect(resumed, OK, 'paused-1: resumed as', 'done: acted 1', where='stdout')
    again = world.stepcore('resume', 'paused-1', '--agent', 'cliapp:agent', '--json', kind='approval')
    assert code(again) == OK, again.stderr
    finished = json.loads(again.stdout)
    assert (finished['finished'], finished['resumed_as']) == (True, None)
    newest = finished['newest_run']
    said = world.stepcore('resume', newest, '--agent', 'cliapp:agent', kind='approval')
    expect(said, OK, f'run {newest} already finished: there is nothing to resume', where='stdout')
    assert world.calls() == 1
    expect(world.cli('answer', 'paused-1', 'call-1', '--approve'), FAILED, 'was resumed by run')
    expect(world.cli('recover', 'paused-1'), OK, 'Nothing left to do', where='stdout')
    expect(world.cli('cancel', newest, '--reason', 'too late'), FAILED, 'it already ended (completed)')


def test_cancel(world: World) -> None:
    assert world.start('paused-2', kind='approval') == 'paused'
    cancelled = world.cli('cancel', 'paused-2', '--reason', 'wrong table', '--by', 'alice')
    expect(cancelled, OK, 'run paused-2 is cancelled by alice: wrong table', where='stdout')
    expect(world.cli('cancel', 'paused-2', '--reason', 'again'), OK, 'cancelled by alice', where='stdout')
    expect(world.cli('cancel', 'no-such-run', '--reason', 'x'), FAILED, "run 'no-such-run' not found")
    expect(world.cli('cancel', 'paused-2', '--reason', ' '), FAILED, '--reason needs a text')
    refused = world.stepcore('resume', 'paused-2', '--agent', 'cliapp:agent', kind='approval')
    expect(refused, FAILED, "run 'paused-2' was cancelled by alice: wrong table", 'never resumed')
    expect(world.cli('answer', 'paused-2', 'call-1', '--approve'), FAILED, 'cancelled by alice: wrong table')
    expect(world.cli('recover', 'paused-2', '--supply', 'call-1=x'), FAILED, 'cancelled by alice: wrong table')


# --- a run a live process holds: 3 --------------------------------------------------------------------------


def test_a_run_held_by_a_live_process_is_refused_with_3(world: World) -> None:
    child = world.start_held('live-1')
    refused = world.stepcore('resume', 'live-1', '--agent', 'cliapp:agent')
    expect(
        refused,
        REFUSED,
        "run 'live-1' is running on ",
        f'pid {child.pid}, lease epoch 1 held until',
        'resuming it would act on a live run',
        'run the command again with --force',
    )
    settle = world.cli('recover', 'live-1', '--supply', 'call-1=done')
    expect(settle, REFUSED, '--supply call-1 would act on a live run', 'with --force')
    told = world.cli('recover', 'live-1')
    expect(told, OK, 'Running now on', 'recovery refuses a live run', where='stdout')
    assert '(recovering it) (' not in told.stdout
    world.release()
    assert child.wait(timeout=60) == 0
    expect(world.cli('recover', 'live-1'), OK, 'Completed: run live-1 has nothing left to do', where='stdout')


def test_the_loser_of_two_processes_resuming_one_run_at_once_exits_3(world: World) -> None:
    assert world.start('race-1', kind='approval') == 'paused'
    expect(world.cli('answer', 'race-1', 'call-1', '--approve'), OK)
    (world.root / 'hold').touch()  # the winner holds the run inside the approved call while the loser tries
    go = world.root / 'go'
    command = [sys.executable, '-m', 'stepcore.cli', 'resume', 'race-1', '--agent', 'cliapp:agent', '-s', world.url]
    env = world.env('approval', CLIAPP_GO=str(go))
    resumers = [
        subprocess.Popen(command, cwd=world.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        time.sleep(1.0)  # both waiting at the word, their agent imported
        go.touch()
        deadline = time.monotonic() + 60
        while not (world.root / 'in-tool').exists():
            assert time.monotonic() < deadline, 'no resumer reached the approved call'
            time.sleep(0.02)
        time.sleep(1.0)
        world.release()
        outputs = [r.communicate(timeout=120) for r in resumers]
    finally:
        for resumer in resumers:
            if resumer.poll() is None:
                resumer.kill()
                resumer.communicate()
    codes = sorted(r.returncode for r in resumers)
    assert codes == [OK, REFUSED], outputs
    loser = next(err for r, (_, err) in zip(resumers, outputs, strict=True) if r.returncode == REFUSED)
    said = ' '.join(loser.split())
    assert said.startswith("error: run 'race-1'") or said.startswith('error: run '), said
    assert 'would act on a live run' in said or 'claimed first by' in said, said
    assert not any(python in said for python in PYTHON_WORDS), said
    assert world.calls() == 1  # the approved call ran once


# --- a crash left for a person: 4, then settled by hand ----------------------------------------------------


def test_a_crash_whose_call_a_person_settles(world: World) -> None:
    world.orphan('ask-1', kind='ask')
    assert world.calls() == 1
    found = world.stepcore('recover', '--orphans', '--agent', 'cliapp:agent', kind='ask')
    expect(
        found,
        WAITING,
        'ask-1: pending: waits for a person to settle act (call-1)',
        'tools without a recovery policy: act',
        '`stepcore recover ask-1 --supply CALL=RESULT`',
        where='stdout',
    )
    expect(world.cli('recover', 'ask-1'), WAITING, 'Pending a person: settle by hand: act (call-1)', where='stdout')
    waits = world.stepcore('resume', 'ask-1', '--agent', 'cliapp:agent', kind='ask')
    expect(
        waits,
        WAITING,
        'nobody settled yet: act (call-1) args {"n": 1}',
        '`stepcore recover ask-1 --supply',
        where='stdout',
    )
    expect(world.cli('recover', 'ask-1', '--mark-checked', 'call-9'), FAILED, "--mark-checked refused: run 'ask-1'")
    settled = world.cli('recover', 'ask-1', '--supply', 'call-1=checked by hand')
    expect(settled, OK, 'Next: `stepcore resume ask-1 --agent MODULE:ATTR`', where='stdout')
    twice = world.cli('recover', 'ask-1', '--supply', 'call-1=again')
    expect(twice, FAILED, '--supply refused', 'already settled by hand (supplied); pass --force to replace that answer')
    resumed = world.stepcore('resume', 'ask-1', '--agent', 'cliapp:agent', kind='ask')
    expect(resumed, OK, 'done: checked by hand', where='stdout')
    assert world.calls() == 1  # settled by hand: not run again


# --- recover --orphans, one pass ------------------------------------------------------------------------------


def test_recover_orphans_exit_codes(world: World) -> None:
    assert world.start('done-0') == 'done: acted 1'
    expect(world.stepcore('recover', '--orphans', '--agent', 'cliapp:agent'), OK, 'no orphaned runs', where='stdout')
    world.orphan('boom-1')
    failed = world.stepcore('recover', '--orphans', '--agent', 'cliapp:agent', CLIAPP_FAIL='1')
    expect(failed, FAILED, 'boom-1: failed: the printer is on fire', where='stdout')
    assert 'RuntimeError' not in failed.stdout
    world.orphan('fine-1')
    resumed = world.stepcore('recover', '--orphans', '--agent', 'cliapp:agent')
    expect(resumed, OK, 'fine-1: resumed as', "output 'done: acted 1'", where='stdout')
    for args, said in (
        (['recover', '--orphans'], '--orphans needs the agents that run them: pass --agent MODULE:ATTR'),
        (['recover', '--orphans', '--agent', 'nowhere'], "--agent 'nowhere' is not MODULE:ATTR"),
        (['recover', '--orphans', '--agent', 'cliapp:nobody'], "--agent 'cliapp:nobody' cannot be imported"),
        (['recover'], 'name the run to recover (RUN), or pass --orphans'),
        (['recover', 'fine-1', '--watch'], '--watch goes with --orphans'),
        (['recover', '--orphans', '--agent', 'cliapp:agent', '--quiet'], '--quiet goes with --watch'),
    ):
        expect(world.stepcore(*args), FAILED, said)


def test_a_dead_run_is_told_in_cli_words(world: World) -> None:
    from stepcore.cli.words import message
    from stepcore.store.leases import DiedAttempt, Lease, LeaseState, Owner, RunDeadError, RunOwnedError
    from stepcore.store.models import utcnow

    now = utcnow()
    died = (DiedAttempt('r2', 'vm pid 7', 2, 'owner gone'),)
    dead = Lease('r1', 3, LeaseState.DEAD, None, now, now, died=died)
    text = message(RunDeadError(dead))
    assert text.startswith("run 'r1' is dead: 1 resumptions of it died (r2 on vm pid 7, epoch 2, owner gone)")
    assert text.endswith('give it another chance with `stepcore recover r1 --retry`')
    recovering = Owner('vm', 22996, 'token', role='recovery')
    held = Lease('r1', 3, LeaseState.RUNNING, recovering, now, now)
    text = message(RunOwnedError(held, action='resolve_run'), action='resuming it', force='--force')
    assert text.startswith("run 'r1' is being recovered by vm pid 22996, lease epoch 3 held until")
    assert '(recovering it) (' not in text
    assert 'resolve_run' not in text
