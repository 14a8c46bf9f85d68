"""A run id equal to the media folder's name would share that folder with every run's media."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai import Agent, BinaryContent
from pydantic_ai.models.test import TestModel

from step_file import FileStepStore
from step_file.store import FilePort
from stepcore import StepPersistence
from stepcore.store.ids import validate_path_safe_run_id

PICTURE = BinaryContent(data=b'\x89PNG' + bytes(range(256)) * 400, media_type='image/png')


async def _run(store: FileStepStore, run_id: str) -> None:
    agent = Agent(TestModel(), capabilities=[StepPersistence(store=store, run_id=run_id)])
    await agent.run(['describe it', PICTURE])


async def test_a_new_run_cannot_take_the_media_folders_name(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await _run(store, 'other')
    media = sorted((tmp_path / 'media').iterdir())
    with pytest.raises(ValueError, match=r"run_id 'media' cannot be used with the file store: .*media folder"):
        await _run(store, 'media')
    assert sorted((tmp_path / 'media').iterdir()) == media  # nothing written into it
    assert [run.run_id for run in await store.list_runs()] == ['other']
    await store.aclose()


async def test_a_run_stored_under_that_name_before_stays_readable_and_its_delete_leaves_the_media(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    older = FileStepStore(tmp_path)
    monkeypatch.setattr(FilePort, 'check_run_id', lambda self, run_id: validate_path_safe_run_id(run_id))
    await _run(older, 'other')
    await _run(older, 'media')  # as a release that did not refuse the name stored it
    await older.aclose()
    monkeypatch.undo()

    store = FileStepStore(tmp_path)
    assert sorted(run.run_id for run in await store.list_runs()) == ['media', 'other']
    snapshot = await store.latest_snapshot('media')
    assert snapshot is not None
    assert snapshot.messages
    assert await store.delete_run('media')
    assert [run.run_id for run in await store.list_runs()] == ['other']
    other = await store.latest_snapshot('other')  # its picture is still in the media folder
    assert other is not None
    content = other.messages[0].parts[0].content  # pyright: ignore[reportAttributeAccessIssue]
    assert content[1].data == PICTURE.data  # pyright: ignore[reportUnknownMemberType]
    await store.aclose()
