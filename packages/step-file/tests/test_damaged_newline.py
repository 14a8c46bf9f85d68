"""A whole last line whose newline byte is damaged is damage, never a write a crash cut short."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from step_file import FileStepStore
from step_file.layout import EFFECTS_FILE, EVENTS_FILE
from stepcore import DamagedRecordError, StepEvent, StepPersistence
from stepcore.store.models import EventKind


async def _run(folder: Path) -> str:
    store = FileStepStore(folder)
    agent = Agent(TestModel(call_tools=['lookup']), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def lookup(word: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'{word}: found'

    await agent.run('look it up')
    (run,) = await store.list_runs()
    await store.aclose()
    return run.run_id


def _damage_last_newline(path: Path) -> None:
    data = path.read_bytes()
    assert data.endswith(b'}\n')
    path.write_bytes(data[:-1] + b'*')  # bit 5 of the newline flipped


async def test_the_newest_ledger_line_with_a_damaged_newline_raises(tmp_path: Path) -> None:
    run_id = await _run(tmp_path)
    _damage_last_newline(tmp_path / run_id / EFFECTS_FILE)
    store = FileStepStore(tmp_path)
    with pytest.raises(DamagedRecordError) as caught:  # never the entry's older, `started` line
        await store.list_tool_effects(run_id)
    assert caught.value.run_id == run_id
    await store.aclose()


async def test_an_event_line_with_a_damaged_newline_is_reported_and_kept_and_appends_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = await _run(tmp_path)
    path = tmp_path / run_id / EVENTS_FILE
    _damage_last_newline(path)
    damaged = path.read_bytes()
    store = FileStepStore(tmp_path)
    with pytest.raises(DamagedRecordError):  # the run's count says the newest event is missing
        await store.list_events(run_id)
    assert any('where its newline belongs' in r.getMessage() for r in caplog.records)
    await store.append_event(StepEvent(run_id=run_id, kind=EventKind.RUN_STARTED, step_index=9))
    assert path.read_bytes().startswith(damaged + b'\n')  # kept, ended, and the new line after it
    await store.aclose()
