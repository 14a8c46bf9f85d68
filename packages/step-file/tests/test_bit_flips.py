"""Single-bit flips in a file store's folder never come back as different records.

A small folder holds a real agent run; for a spread of byte positions over all its files, a copy
with one bit flipped is opened and read whole through the public API. Every read must answer what
the intact folder answers, or fail, or leave a record out with a warning: never answer something
else.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from step_file import FileStepStore
from stepcore.capability import StepPersistence
from stepcore_conformance.bitflips import Outcome, flip_bit, judge, positions, read_everything, warnings_logged
from stepcore_conformance.report import SUMMARY_PROPERTY

SAMPLE = int(os.environ.get('STEPCORE_BITFLIP_SAMPLE', '400'))
"""How many byte positions to flip (set higher to flip more, e.g. every byte of every file)."""


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    calls = sum(1 for m in messages if isinstance(m, ModelResponse))
    if calls < 2:
        return ModelResponse(parts=[ToolCallPart('double', {'n': calls + 1}, tool_call_id=f'call-{calls}')])
    return ModelResponse(parts=[TextPart('all doubled')])


async def _build(folder: Path) -> list[str]:
    persistence = StepPersistence(store=FileStepStore(folder), agent_name='doubler')
    agent = Agent(FunctionModel(_model), capabilities=[persistence])

    @agent.tool_plain
    def double(n: int) -> str:
        return f'doubled {n} is {2 * n}'

    await agent.run('double 1 and 2')
    runs = [r.run_id for r in await persistence.store.list_runs()]
    await persistence.store.aclose()
    return runs


async def test_a_flipped_bit_is_read_back_equal_or_reported(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    folder = tmp_path / 'runs'
    run_ids = await _build(folder)
    store = FileStepStore(folder)
    original = await read_everything(store, run_ids)
    await store.aclose()
    assert not original.errors
    files = sorted(p for p in folder.rglob('*') if p.is_file() and p.stat().st_size)
    spans = [(path.relative_to(folder), offset) for path in files for offset in range(path.stat().st_size)]
    outcomes: Counter[Outcome] = Counter()
    silent: list[str] = []
    lost: list[str] = []
    unnamed: list[str] = []
    for index, position in enumerate(positions(len(spans), SAMPLE)):
        name, offset = spans[position]
        copy = tmp_path / f'copy{index}'
        shutil.copytree(folder, copy)
        target = copy / name
        target.write_bytes(flip_bit(target.read_bytes(), offset, index))
        with warnings_logged() as warned:
            damaged = FileStepStore(copy)
            try:
                reading = await read_everything(damaged, run_ids)
            finally:
                await damaged.aclose()
        outcome, what = judge(original, reading, bool(warned))
        outcomes[outcome] += 1
        unnamed += [f'flip {index}: {read}: {error}' for read, error in reading.unnamed.items()]
        if outcome in ('silent', 'lost', 'stale'):
            (silent if outcome == 'silent' else lost).append(f'{name} byte {offset} bit {index % 8}: {what}')
        shutil.rmtree(copy)
    line = (
        f'file store bit flips over {len(spans)} bytes in {len(files)} files: {dict(outcomes)}, '
        f'errors not naming the run: {len(unnamed)}'
    )
    print(line, *lost, *unnamed[:20], sep='\n')
    record_property(SUMMARY_PROPERTY, line)
    assert outcomes['same'] + outcomes['detected'] > 0
    assert not silent, '\n'.join(silent[:20])
    assert not lost, '\n'.join(lost[:20])
    assert not unnamed, '\n'.join(unnamed[:20])
