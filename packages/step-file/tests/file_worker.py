"""A separate process writing into a FileStepStore directory (driven by test_multiprocess.py).

Usage: python file_worker.py <directory> <tag> <count>

The process (1) registers the run `contested` with registration id `<tag>` and prints `ok` or
`duplicate`, (2) writes its own run `run-<tag>`: `count` steps of event, tool effect and snapshot,
interleaved with (3) appending `count` events tagged `<tag>-<n>` to the run `shared`.
"""

from __future__ import annotations

import sys

import anyio
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

from step_file import FileStepStore
from stepcore import ContinuableSnapshot, EventKind, RunRecord, StepEvent, ToolEffectRecord, ToolEffectStatus


async def main(directory: str, tag: str, count: int) -> None:
    store = FileStepStore(directory)
    try:
        await store.register_run(RunRecord(run_id='contested', registration_id=tag))
    except ValueError:
        print('duplicate')
    else:
        print('ok')
    run_id = f'run-{tag}'
    await store.register_run(RunRecord(run_id=run_id, conversation_id='shared'))
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(f'task {run_id}')])]
    for n in range(count):
        call_id = f'{tag}-{n}'
        await store.append_event(
            StepEvent(run_id='shared', kind=EventKind.TOOL_CALL_STARTED, tool_call_id=call_id, step_index=0)
        )
        await store.append_event(StepEvent(run_id=run_id, kind=EventKind.TOOL_CALL_STARTED, step_index=n))
        await store.record_tool_effect(
            ToolEffectRecord(run_id=run_id, tool_call_id=call_id, tool_name='t', status=ToolEffectStatus.STARTED)
        )
        messages.append(ModelResponse(parts=[ToolCallPart('t', {'n': n}, tool_call_id=call_id)]))
        messages.append(ModelRequest(parts=[ToolReturnPart('t', f'result {n}', tool_call_id=call_id)]))
        await store.save_snapshot(
            ContinuableSnapshot(run_id=run_id, step_index=n, messages=messages, idempotency_key=f'snap-{n}')
        )
    await store.aclose()


if __name__ == '__main__':
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
