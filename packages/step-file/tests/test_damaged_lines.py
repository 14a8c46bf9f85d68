"""Damaged lines of the file store's logs are reported, never taken for a torn write or hidden behind a later line."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from step_file import FileStepStore
from step_file.files import Log
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


def _two_calls(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    calls = sum(1 for m in messages if isinstance(m, ModelResponse))
    if calls < 2:
        return ModelResponse(parts=[ToolCallPart('lookup', {'word': f'w{calls}'}, tool_call_id=f'call-{calls}')])
    return ModelResponse(parts=[TextPart('done')])


async def test_a_ledger_line_whose_call_id_was_altered_is_not_hidden_behind_a_later_line(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    agent = Agent(FunctionModel(_two_calls), capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def lookup(word: str) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'{word}: found'

    await agent.run('look both up')
    (run,) = await store.list_runs()
    await store.aclose()
    ledger = tmp_path / run.run_id / EFFECTS_FILE
    lines = ledger.read_bytes().splitlines(keepends=True)
    completed = next(i for i, line in enumerate(lines) if b'"call-0"' in line and b'"completed"' in line)
    assert any(b'"call-1"' in line for line in lines[completed + 1 :])  # call-1's lines come after it
    lines[completed] = lines[completed].replace(b'"call-0"', b'"call-1"')  # one bit: '0' -> '1'
    ledger.write_bytes(b''.join(lines))
    store = FileStepStore(tmp_path)
    with pytest.raises(DamagedRecordError) as caught:  # never call-0 read back as only `started`
        await store.list_tool_effects(run.run_id)
    assert caught.value.run_id == run.run_id
    with pytest.raises(DamagedRecordError):
        await store.list_unresolved_tool_effects(run.run_id)
    await store.aclose()


class _Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[int, bytes]] = []

    def add(self, number: int, line: bytes) -> None:
        self.lines.append((number, line))


def test_a_reader_without_the_lock_does_not_count_the_newline_a_writer_adds_to_a_damaged_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / 'log.jsonl'
    path.write_bytes(b'{"a":1}\n{"b":2}*')  # the last line's newline damaged
    reader = Log(path, _Lines)
    assert reader.refresh(repair=False).lines == [(1, b'{"a":1}'), (2, b'{"b":2}*')]
    writer = Log(path, _Lines)
    with writer.writing() as fd:  # ends the damaged line, then appends
        writer.append(fd, b'{"c":3}\n', sync=False)
    assert path.read_bytes() == b'{"a":1}\n{"b":2}*\n{"c":3}\n'
    expected = [(1, b'{"a":1}'), (2, b'{"b":2}*'), (3, b'{"c":3}')]
    assert writer.seen.lines == expected
    assert reader.refresh(repair=False).lines == expected  # no empty line 3, no line numbered 4
