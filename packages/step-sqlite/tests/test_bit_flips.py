"""Single-bit flips in a SQLite database never come back as different records.

A small database holds a real agent run; for a spread of byte positions, a copy with one bit
flipped is opened and read whole through the public API. Every read must answer what the intact
database answers, or fail, or leave a record out with a warning: never answer something else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_sqlite import SqliteStepStore
from stepcore.capability import StepPersistence
from stepcore_conformance.bitflips import Outcome, flip_bit, judge, positions, read_everything, warnings_logged
from stepcore_conformance.report import SUMMARY_PROPERTY

SAMPLE = int(os.environ.get('STEPCORE_BITFLIP_SAMPLE', '400'))
"""How many byte positions to flip (set higher to flip more, e.g. every byte of the file)."""


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    calls = sum(1 for m in messages if isinstance(m, ModelResponse))
    if calls < 2:
        return ModelResponse(parts=[ToolCallPart('double', {'n': calls + 1}, tool_call_id=f'call-{calls}')])
    return ModelResponse(parts=[TextPart('all doubled')])


async def _build(db: Path) -> list[str]:
    persistence = StepPersistence(store=SqliteStepStore(database=db), agent_name='doubler')
    agent = Agent(FunctionModel(_model), capabilities=[persistence])

    @agent.tool_plain
    def double(n: int) -> str:
        return f'doubled {n} is {2 * n}'

    await agent.run('double 1 and 2')
    await agent.run('once more', conversation_id='c-1')
    runs = [r.run_id for r in await persistence.store.list_runs()]
    await persistence.store.aclose()
    return runs


async def test_a_flipped_bit_is_read_back_equal_or_reported(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    db = tmp_path / 'runs.db'
    run_ids = await _build(db)
    store = SqliteStepStore(database=db)
    original = await read_everything(store, run_ids)
    await store.aclose()
    assert not original.errors
    for suffix in ('-wal', '-shm'):
        assert not Path(f'{db}{suffix}').exists() or Path(f'{db}{suffix}').stat().st_size == 0
    data = db.read_bytes()
    outcomes: Counter[Outcome] = Counter()
    silent: list[str] = []
    lost: list[str] = []
    unnamed: list[str] = []
    copy = tmp_path / 'copy.db'
    for index, position in enumerate(positions(len(data), SAMPLE)):
        copy.write_bytes(flip_bit(data, position, index))
        with warnings_logged() as warned:
            try:
                damaged = SqliteStepStore(database=copy)
            except Exception:
                outcomes['detected'] += 1
                continue
            try:
                reading = await read_everything(damaged, run_ids)
            finally:
                with contextlib.suppress(Exception):
                    await damaged.aclose()
        outcome, what = judge(original, reading, bool(warned))
        outcomes[outcome] += 1
        unnamed += [f'flip {index}: {read}: {error}' for read, error in reading.unnamed.items()]
        if outcome in ('silent', 'lost', 'stale'):
            (silent if outcome == 'silent' else lost).append(f'byte {position} bit {index % 8}: {what}')
        for extra in tmp_path.glob('copy.db*'):
            extra.unlink() if extra.is_file() else shutil.rmtree(extra)
    line = f'sqlite bit flips over {len(data)} bytes: {dict(outcomes)}, errors not naming the run: {len(unnamed)}'
    print(line, *lost, *unnamed[:20], sep='\n')
    record_property(SUMMARY_PROPERTY, line)
    assert outcomes['same'] + outcomes['detected'] > 0
    assert not silent, '\n'.join(silent[:20])
    assert not lost, '\n'.join(lost[:20])
    assert not unnamed, '\n'.join(unnamed[:20])


async def test_a_store_refused_whole_is_a_detection_that_names_no_run(tmp_path: Path) -> None:
    """A flip in the schema's version makes the database look newer than this release: every read,
    `list_runs` first, is refused with the same error naming the database, which counts as detected."""
    import sqlite3

    db = tmp_path / 'runs.db'
    run_ids = await _build(db)
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:
        raw.execute("UPDATE stepcore_schema SET version = version + 32 WHERE component = 'steps'")
    store = SqliteStepStore(database=db)
    try:
        reading = await read_everything(store, run_ids)
    finally:
        await store.aclose()
    assert 'newer than this step-sqlite supports' in reading.errors['list_runs']
    assert len(reading.errors) == 1 + 6 * len(run_ids)
    assert not reading.unnamed
