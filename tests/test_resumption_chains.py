"""Resuming a resumption that was killed in turn, before it saved a complete snapshot.

Each attempt is a real process (`resumption_child.py`) on a SQLite file, SIGKILLed at a chosen
point; the test resumes in this process. The tool appends a line to a file with no deduplication,
so a call run twice shows as a second line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from step_sqlite import SqliteStepStore
from stepcore import ToolEffectStatus, inspect_recovery, mark_checked, resolve_run, supply_result
from stepcore.capability.context import RESUMES_KEY

CHILD = Path(__file__).with_name('resumption_child.py')
_spec = importlib.util.spec_from_file_location('resumption_child', CHILD)
assert _spec is not None
assert _spec.loader is not None
child = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(child)
NOTE_CALL: str = child.NOTE_CALL
build_agent = child.build_agent
note_line = child.note_line
TIMEOUT_SECONDS = 60


class World:
    def __init__(self, folder: Path) -> None:
        self.database = folder / 'runs.db'
        self.notes = folder / 'notes.txt'
        self.folder = folder

    def attempt(
        self,
        run_id: str,
        *,
        stop: str,
        resume: str | None = None,
        capture_frontier: bool = True,
        policies: dict[str, str] | None = None,
        lease_ttl: float | None = 30.0,
    ) -> None:
        """Run one attempt in a child process until it stops at `stop`, SIGKILLed (by itself or by the test)."""
        reached = self.folder / f'reached-{run_id}'
        job = {
            'database': str(self.database),
            'notes': str(self.notes),
            'reached': str(reached),
            'run_id': run_id,
            'resume': resume,
            'capture_frontier': capture_frontier,
            'stop': stop,
            'policies': policies,
            'lease_ttl': lease_ttl,
        }
        process = subprocess.Popen([sys.executable, str(CHILD), json.dumps(job)])
        try:
            deadline = time.monotonic() + TIMEOUT_SECONDS
            while not reached.exists() and process.poll() is None:
                assert time.monotonic() < deadline, f'attempt {run_id} never reached {stop!r}'
                time.sleep(0.02)
        finally:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
            process.wait()
        assert process.returncode == -signal.SIGKILL, f'attempt {run_id} ended with status {process.returncode}'

    def notes_written(self) -> list[str]:
        return self.notes.read_text().splitlines() if self.notes.exists() else []


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def _resume(world: World, run_id: str, new_run_id: str, **options: Any) -> tuple[str, ...]:
    """Resolve `run_id` and run it to the end as `new_run_id`; how each call was settled."""
    async with SqliteStepStore(database=world.database) as store:
        agent = build_agent(store, world.notes, run_id=new_run_id, capture_frontier=True)
        resumption = await resolve_run(store, run_id=run_id, agent=agent, **options)
        assert resumption.ready, resumption
        result = await resumption.run(agent)
        assert result.output == 'done'
        record = await store.get_run(run_id=new_run_id)
        assert record is not None
        assert record.metadata[RESUMES_KEY] == run_id
    return tuple(s.how for s in resumption.settled)


async def test_a_call_a_killed_resumption_started_is_reconciled_not_run_again(world: World) -> None:
    # The crashed run saved the model's response, then died before its call started: no ledger entry.
    world.attempt('r-0', stop='before-tools')
    # Its resumption runs the call (nothing said it had started) and dies inside it, the note written.
    world.attempt('r-1', resume='r-0', stop='in-tool')
    # The next resumption dies as soon as it is registered.
    world.attempt('r-2', resume='r-1', stop='at-start')
    assert world.notes_written() == [note_line('one')]
    async with SqliteStepStore(database=world.database) as store:
        for run_id in ('r-1', 'r-2'):
            assert await store.latest_snapshot(run_id=run_id) is None
        assert await store.get_tool_effect(run_id='r-0', tool_call_id=NOTE_CALL) is None

    assert await _resume(world, 'r-2', 'r-3') == ('reconciled',)

    assert world.notes_written() == [note_line('one')]
    async with SqliteStepStore(database=world.database) as store:
        entry = await store.get_tool_effect(run_id='r-1', tool_call_id=NOTE_CALL)
        assert entry is not None
        assert entry.status is ToolEffectStatus.COMPLETED
        assert entry.effect_summary == "append 'one' [settled on recovery: reconciled]"
        report = await inspect_recovery(store=store, run_id='r-1')
        assert not report.unresolved


async def test_calls_of_a_response_a_killed_resumption_got_are_reconciled_not_run_again(world: World) -> None:
    # The crashed run saved its prompt and died in the model request: a snapshot with no cut cycle.
    world.attempt('r-0', stop='in-model')
    # Its resumption (recording without capture_frontier) asks the model, runs the call and dies inside
    # it: the call is in its ledger, but it saved no complete snapshot.
    world.attempt('r-1', resume='r-0', stop='in-tool', capture_frontier=False)
    async with SqliteStepStore(database=world.database) as store:
        assert await store.latest_snapshot(run_id='r-1') is None
        [entry] = await store.list_unresolved_tool_effects(run_id='r-1')
        assert entry.tool_call_id == NOTE_CALL

    assert await _resume(world, 'r-1', 'r-2') == ('reconciled',)
    assert world.notes_written() == [note_line('one')]


async def test_an_ask_call_a_killed_resumption_started_is_settled_by_hand_through_any_later_run(
    world: World,
) -> None:
    world.attempt('r-0', stop='before-tools')
    world.attempt('r-1', resume='r-0', stop='in-tool')
    # Resolved by a policy that re-runs the call, then killed before the call ran again.
    world.attempt('r-2', resume='r-1', stop='at-start', policies={'append_note': 'rerun'})
    async with SqliteStepStore(database=world.database) as store:
        # Under 'ask' that earlier decision is no answer: the call waits for the caller.
        resumption = await resolve_run(store, run_id='r-2', policies={'append_note': 'ask'})
        assert resumption.snapshot_run_id == 'r-0'
        [pending] = resumption.pending
        assert (pending.run_id, pending.tool_call_id, pending.args) == ('r-1', NOTE_CALL, {'text': 'one'})
        with pytest.raises(LookupError, match=r"run 'r-2' has no ledger entry for tool call 'nope' \(nor do the runs"):
            await mark_checked(store, run_id='r-2', tool_call_id='nope')
        # Asked about the newest run, which holds no entry of its own: the entry of the run it resumes is settled.
        settled = await supply_result(store, run_id='r-2', tool_call_id=NOTE_CALL, result='noted (checked)')
        assert (settled.run_id, settled.status) == ('r-1', ToolEffectStatus.COMPLETED)

    assert await _resume(world, 'r-2', 'r-3', policies={'append_note': 'ask'}) == ('supplied',)
    assert world.notes_written() == [note_line('one')]


async def test_a_run_killed_before_any_snapshot_names_the_runs_it_resumes(world: World) -> None:
    # Without a lease nothing kept the run's start: there is nothing to resume from.
    world.attempt('r-0', stop='in-model', capture_frontier=False, lease_ttl=None)
    world.attempt('r-1', resume=None, stop='at-start', lease_ttl=None)
    async with SqliteStepStore(database=world.database) as store:
        with pytest.raises(LookupError, match=r"run 'r-0' has no complete snapshot to resume from, and its store kept"):
            await resolve_run(store, run_id='r-0')


async def test_a_run_killed_in_its_first_model_request_resumes_from_its_start_point(world: World) -> None:
    # Default settings (no capture_frontier): the lease kept the prompt, so the run is resumable.
    world.attempt('r-0', stop='in-model', capture_frontier=False)
    async with SqliteStepStore(database=world.database) as store:
        assert await store.latest_snapshot(run_id='r-0', include_interrupted=True) is None
        report = await inspect_recovery(store=store, run_id='r-0')
        assert report.start_point
        resumption = await resolve_run(store, run_id='r-0')
        assert resumption.from_start
        assert resumption.ready
        assert resumption.deferred_tool_results is None
        assert [type(m).__name__ for m in resumption.message_history] == ['ModelRequest']
        await resumption.release()  # resolved again below, and run
    assert await _resume(world, 'r-0', 'r-1') == ()
    assert world.notes_written() == [note_line('one')]


async def test_a_run_killed_inside_its_first_tool_call_is_settled_not_run_again(world: World) -> None:
    # Default settings: killed inside the first tool call, after its effect; no complete snapshot at all.
    world.attempt('r-0', stop='in-tool', capture_frontier=False)
    assert world.notes_written() == [note_line('one')]
    async with SqliteStepStore(database=world.database) as store:
        assert await store.latest_snapshot(run_id='r-0') is None
    assert await _resume(world, 'r-0', 'r-1') == ('reconciled',)
    assert world.notes_written() == [note_line('one')]
