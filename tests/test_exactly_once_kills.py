"""Exactly-once effects under fire: agent runs SIGKILLed at random moments, resumed with `resolve_run`.

Each backend (SQLite, the file store, PostgreSQL) runs stories of an agent with a `'rerun'` tool
(deduplicated downstream by its idempotency key) and a reconcile tool (a bare append to a file),
three tool cycles each (see `exactly_once_zygote.py`). Every attempt is a child forked from one
zygote process and SIGKILLed after a delay drawn from a seeded generator; a killed story is resumed
(`resolve_run` then `Resumption.run`) until an attempt completes. Then every effect must be there
exactly once, and every story's history must hold one result per call.

The counts (kills per backend, kills inside a tool, resumes, resumes of a resumption killed before
its first complete snapshot, effects) are printed and reported.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic_ai.messages import ModelRequest, TextPart, ToolReturnPart

import stepcore
from stepcore import StepStore
from stepcore_conformance.forkserver import Zygote, zygote
from stepcore_conformance.report import SUMMARY_PROPERTY

ZYGOTE = Path(__file__).with_name('exactly_once_zygote.py')
SEED = int(os.environ.get('KILL_SEED', '20240611'))
KILLS_PER_BACKEND = 40
"""Stories are started on a backend until this many kills happened there."""
MAX_STORIES = 100
"""Stories per backend before the test gives up reaching `KILLS_PER_BACKEND` (runs too fast to be killed)."""
KILL_WINDOW = (0.0, 0.12)
"""Seconds after the start of an attempt within which it is killed (an attempt takes longer)."""
SPARE = 0.2
"""Share of attempts not killed at all, so that stories end."""
REPLY_TIMEOUT_SECONDS = 120
MAX_ATTEMPTS = 40
"""Attempts of one story before the test gives up (a guard against a story that never ends)."""
CYCLES = ('a', 'b', 'c')
FINISHED = 3
"""The zygote's exit status for a resumed run that had already ended (`exactly_once_zygote.FINISHED`)."""


def _zygote(spec: dict[str, Any], world: Path) -> AbstractAsyncContextManager[Zygote]:
    """The fork server of `exactly_once_zygote.py` for `spec`, changing the world in `world`."""
    return zygote(
        (str(ZYGOTE), json.dumps(spec), str(world)), world / 'zygote.stderr', reply_seconds=REPLY_TIMEOUT_SECONDS
    )


def _inside_tool(world: Path, run_id: str) -> bool:
    trace = world / f'trace-{run_id}'
    if not trace.exists():
        return False
    lines = Counter(trace.read_text().split())
    return lines['enter'] > lines['exit']


async def _check_story(store: StepStore, run_id: str, story: str) -> None:
    """The completed run's history answers each call exactly once and ends with the final answer."""
    latest = await store.latest_snapshot(run_id)
    assert latest is not None, f'story {story}: its last run {run_id!r} has no complete snapshot'
    returns = Counter(
        part.tool_call_id
        for message in latest.messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    )
    expected = {f'{tool}-{letter}': 1 for tool in ('row', 'note') for letter in CYCLES}
    assert dict(returns) == expected, f'story {story}: results in the history of {run_id!r}: {dict(returns)}'
    assert [p.content for p in latest.messages[-1].parts if isinstance(p, TextPart)] == ['all written']


async def _kill_and_resume(
    spec: dict[str, Any], world: Path, backend: str, rng: random.Random
) -> tuple[dict[str, int], list[str]]:
    counts = Counter[str]()
    stories: list[str] = []
    store = cast(StepStore, stepcore.from_spec(**spec))
    try:
        async with _zygote(spec, world) as server:
            while counts['kills'] < KILLS_PER_BACKEND:
                if len(stories) == MAX_STORIES:
                    pytest.fail(f'{backend}: {MAX_STORIES} stories got only {counts["kills"]} kills')
                story = f'{backend}-{len(stories)}'
                stories.append(story)
                target: str | None = None
                for attempt in range(MAX_ATTEMPTS):
                    run_id = f'{story}-{attempt}'
                    spare = rng.random() < SPARE
                    delay = None if spare else rng.uniform(*KILL_WINDOW)
                    job = {'story': story, 'run_id': run_id, 'resume': target, 'kill_after': delay}
                    # A resumption killed before its first complete snapshot: resolved through the run it resumes.
                    counts['resumes of a resumption without a snapshot'] += (
                        target is not None and await store.latest_snapshot(target) is None
                    )
                    code = int((await server.run(job))['exit'])
                    counts['resumes'] += target is not None
                    if code in (0, FINISHED):  # FINISHED: the run resumed had saved its final answer
                        await _check_story(store, run_id if code == 0 else cast(str, target), story)
                        counts['completed after the final save'] += code == FINISHED
                        break
                    if code != -9:
                        pytest.fail(server.failure(f'attempt {run_id} failed with exit status {code}'))
                    counts['kills'] += 1
                    counts['kills inside a tool'] += _inside_tool(world, run_id)
                    if await store.get_run(run_id) is not None:
                        target = run_id
                else:
                    pytest.fail(f'story {story} did not complete in {MAX_ATTEMPTS} attempts')
    finally:
        await store.aclose()
    counts['stories'] = len(stories)
    return dict(counts), stories


def _effects(world: Path, stories: list[str]) -> dict[str, int]:
    """Check every effect happened exactly once; the counts of effects and of tool attempts."""
    notes = Counter((world / 'notes.txt').read_text().splitlines())
    with sqlite3.connect(world / 'world.db') as db:
        rows = Counter(key for (key,) in db.execute('SELECT key FROM rows'))
        attempts = db.execute('SELECT count(*) FROM attempts').fetchone()[0]
    want_notes = {f'note::{s}::{c}' for s in stories for c in CYCLES}
    want_rows = {f'row::{s}::{c}' for s in stories for c in CYCLES}
    twice = {line: n for line, n in notes.items() if n != 1}
    assert not twice, f'notes written more than once: {twice} (in {world})'
    assert set(notes) == want_notes, f'notes missing: {want_notes - set(notes)}; unexpected: {set(notes) - want_notes}'
    assert set(rows) == want_rows, f'rows missing: {want_rows - set(rows)}'
    return {'notes': sum(notes.values()), 'rows': sum(rows.values()), 'row attempts': attempts}


def _postgres_spec() -> Iterator[dict[str, Any]]:
    import psycopg
    from psycopg import sql

    url = os.environ.get('STEP_POSTGRES_URL', '').strip()
    if not url:
        pytest.fail('STEP_POSTGRES_URL is not set: start the test servers with scripts/test.sh')
    prefix = f't_{uuid.uuid4().hex[:16]}'
    yield {'backend': 'postgres', 'dsn': url, 'table_prefix': prefix}
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            """SELECT c.relname, c.relkind FROM pg_class c
            WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'S')
            AND c.relname LIKE %s""",
            (prefix + r'\_%',),
        ).fetchall()
        for name, kind in sorted(rows, key=lambda r: r[1] != 'r'):
            keyword = sql.SQL('TABLE' if kind == 'r' else 'SEQUENCE')
            conn.execute(sql.SQL('DROP {} IF EXISTS {} CASCADE').format(keyword, sql.Identifier(name)))


@pytest.fixture
def postgres_spec() -> Iterator[dict[str, Any]]:
    yield from _postgres_spec()


async def test_every_effect_happens_exactly_once_across_random_kills(
    tmp_path: Path, postgres_spec: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    rng = random.Random(SEED)
    specs = {
        'sqlite': {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')},
        'file': {'backend': 'file', 'directory': str(tmp_path / 'runs')},
        'postgres': postgres_spec,
    }
    began = time.perf_counter()
    report: dict[str, dict[str, int]] = {}
    for backend, spec in specs.items():
        world = tmp_path / f'world-{backend}'
        world.mkdir()
        counts, stories = await _kill_and_resume(spec, world, backend, rng)
        counts.update(_effects(world, stories))
        report[backend] = counts
    seconds = time.perf_counter() - began
    kills = sum(c.get('kills', 0) for c in report.values())
    lines = [f'exactly once under SIGKILL (seed {SEED}, {seconds:.1f} s): {kills} kills']
    lines += [f'  {backend}: {counts}' for backend, counts in report.items()]
    print('\n'.join(lines))
    record_property(SUMMARY_PROPERTY, '\n'.join(lines))
    assert kills >= 100, report
    assert sum(c.get('kills inside a tool', 0) for c in report.values()) > 0, report
