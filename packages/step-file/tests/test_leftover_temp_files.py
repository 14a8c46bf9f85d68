"""A process killed between creating a temporary file and renaming it leaves the file behind; the
next store that writes the run removes it, and nothing else."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import anyio
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from step_file import FileStepStore
from stepcore import ContinuableSnapshot
from stepcore.backend_io.files import TEMP_NAME

# Saves one snapshot, then kills itself (SIGKILL) when the second snapshot's temporary file is
# about to be renamed into place.
_KILLED_MID_SAVE = textwrap.dedent(
    """
    import os, signal, sys
    import anyio
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
    import stepcore.backend_io.files
    from step_file import FileStepStore
    from functools import partial
    from stepcore import ContinuableSnapshot

    renames = []
    real_replace = os.replace

    def replace(src, dst):
        renames.append(dst)
        if len(renames) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst)

    stepcore.backend_io.files.os.replace = replace

    async def main():
        store = FileStepStore(sys.argv[1])
        first = [ModelRequest(parts=[UserPromptPart('go')]), ModelResponse(parts=[TextPart('one')])]
        snap = partial(ContinuableSnapshot, run_id='killed')
        await store.save_snapshot(snap(step_index=1, messages=first, idempotency_key='s1'))
        second = [*first, ModelRequest(parts=[UserPromptPart('more')])]
        await store.save_snapshot(snap(step_index=2, messages=second, idempotency_key='s2'))

    anyio.run(main)
    """
)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob('*') if TEMP_NAME.fullmatch(p.name))


async def test_a_temp_file_left_by_a_killed_save_is_removed_by_the_next_writer(tmp_path: Path) -> None:
    with anyio.fail_after(120):
        killed = await anyio.run_process([sys.executable, '-c', _KILLED_MID_SAVE, str(tmp_path)], check=False)
    assert killed.returncode == -9, killed.stderr.decode()
    run = tmp_path / 'killed'
    assert len(_leftovers(run)) == 1  # the second snapshot's file, created and never renamed
    unrelated = run / 'snapshots' / 'notes.tmp'
    unrelated.write_text('not ours')

    store = FileStepStore(tmp_path)
    latest = await store.latest_snapshot('killed')
    assert latest is not None
    assert latest.idempotency_key == 's1'
    assert _leftovers(run) != []  # reading removes nothing
    messages: list[ModelMessage] = [*latest.messages, ModelRequest(parts=[UserPromptPart('again')])]
    await store.save_snapshot(
        ContinuableSnapshot(run_id='killed', messages=messages, idempotency_key='s3', step_index=0)
    )

    assert _leftovers(run) == []
    assert unrelated.read_text() == 'not ours'
    latest = await store.latest_snapshot('killed')
    assert latest is not None
    assert (latest.idempotency_key, latest.messages) == ('s3', messages)
    assert [s.idempotency_key for s in await store.list_snapshots('killed')] == ['s1', 's3']
    await store.save_snapshot(
        ContinuableSnapshot(run_id='killed', messages=[*messages, ModelResponse(parts=[TextPart('x')])], step_index=0)
    )
    assert len(await store.list_snapshots('killed')) == 3
