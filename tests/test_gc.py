"""`collect_garbage` beyond the conformance kit: what it refuses, and what it never overlooks."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import cast

import pytest
from pydantic_ai.messages import BinaryContent, ModelRequest, UserPromptPart

from media_disk import DiskMediaStore
from step_sqlite import SqliteStepStore
from stepcore import (
    ContinuableSnapshot,
    DamagedRecordError,
    Encryption,
    InMemoryStepStore,
    RunRecord,
    SnapshotState,
    StepEvent,
    StepStore,
    ToolEffectRecord,
    collect_garbage,
    generate_key,
)
from stepcore.media import EMPTY_CONTEXT, MediaContext, MediaStore, media_uri
from stepcore.store.models import utcnow
from stepcore_conformance import InMemoryMediaStore
from stepcore_conformance.contract import ProtocolOnlyStore
from stepcore_conformance.media_collection import MediaMemoryStepStore

LATER = timedelta(days=1)


def _with_image(data: bytes) -> list[ModelRequest]:
    image = cast(Callable[..., BinaryContent], BinaryContent)(data=data, media_type='image/png')
    return [ModelRequest(parts=[UserPromptPart(['look', image])])]


class _PlainMedia(MediaStore):
    """A media store without the collection feature."""

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        return media_uri(data)

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        raise LookupError(uri)

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        return False

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        return None

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> None:
        return None


async def test_a_store_without_media_or_a_media_store_without_the_feature_is_refused() -> None:
    store = InMemoryStepStore()
    with pytest.raises(ValueError, match='keeps no media store, so pass media_store='):
        await collect_garbage(store)
    with pytest.raises(NotImplementedError, match="'media_collection'"):
        await collect_garbage(store, _PlainMedia())
    with pytest.raises(ValueError, match='no step store'):
        await collect_garbage([], InMemoryMediaStore())


async def test_every_store_sharing_the_media_store_is_marked(tmp_path: Path) -> None:
    media = DiskMediaStore(tmp_path / 'media')
    first = SqliteStepStore(database=tmp_path / 'a.db', media_store=media, media_threshold_bytes=1024)
    second = SqliteStepStore(database=tmp_path / 'b.db', media_store=media, media_threshold_bytes=1024)
    try:
        await first.save_snapshot(ContinuableSnapshot(run_id='a', messages=_with_image(b'a' * 2048), step_index=0))
        await second.save_snapshot(ContinuableSnapshot(run_id='b', messages=_with_image(b'b' * 2048), step_index=0))
        alone = await collect_garbage(first, dry_run=True, now=utcnow() + LATER)
        assert alone.removed_uris == [media_uri(b'b' * 2048)], 'a store left out does not hold its media'
        together = await collect_garbage([first, second], media, now=utcnow() + LATER)
        assert (together.removed, together.kept_referenced, together.runs) == (0, 2, 2)
    finally:
        await first.aclose()
        await second.aclose()


async def test_a_snapshot_saved_without_registering_its_run_holds_its_media(tmp_path: Path) -> None:
    store = SqliteStepStore(database=tmp_path / 'runs.db', media_threshold_bytes=1024)
    try:
        await store.save_snapshot(
            ContinuableSnapshot(run_id='unregistered', messages=_with_image(b'u' * 2048), step_index=0)
        )
        assert await store.list_runs() == []
        report = await collect_garbage(store, now=utcnow() + LATER)
        assert (report.removed, report.kept_referenced) == (0, 1)
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    ('damage', 'reason'),
    [
        ("UPDATE message_nodes SET body = substr(body, 1, length(body) - 20) WHERE run_id = 'hurt'", 'is damaged'),
        ("DELETE FROM message_nodes WHERE run_id = 'hurt'", 'is missing'),
    ],
    ids=['cut short', 'missing'],
)
async def test_a_damaged_snapshot_stops_the_collection_before_anything_is_removed(
    tmp_path: Path, damage: str, reason: str
) -> None:
    database = tmp_path / 'runs.db'
    store = SqliteStepStore(database=database, media_threshold_bytes=1024)
    try:
        await store.register_run(RunRecord(run_id='hurt'))
        await store.save_snapshot(ContinuableSnapshot(run_id='hurt', messages=_with_image(b'h' * 2048), step_index=0))
        assert store.media_store is not None
        loose = await store.media_store.put(b'loose' * 500)
        with sqlite3.connect(database) as raw:
            raw.execute(damage)
        with pytest.raises(DamagedRecordError, match=f"run 'hurt'.*{reason}"):
            await collect_garbage(store, now=utcnow() + LATER)
        assert await store.media_store.exists(media_uri(b'h' * 2048))
        assert await store.media_store.exists(loose)
    finally:
        await store.aclose()


class _NotOnTheEngine(StepStore):
    """A `StepStore` of its own (here delegating to an engine store): collection reads it through the API."""

    def __init__(self, inner: StepStore) -> None:
        self.inner = inner

    async def register_run(self, record: RunRecord) -> None:
        await self.inner.register_run(record)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.inner.get_run(run_id)

    async def list_runs(
        self, *, conversation_id: str | None = None, parent_run_id: str | None = None
    ) -> list[RunRecord]:
        return await self.inner.list_runs(conversation_id=conversation_id, parent_run_id=parent_run_id)

    async def delete_run(self, run_id: str) -> bool:
        return await self.inner.delete_run(run_id)

    async def append_event(self, event: StepEvent) -> None:
        await self.inner.append_event(event)

    async def list_events(self, run_id: str) -> list[StepEvent]:
        return await self.inner.list_events(run_id)

    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        await self.inner.record_tool_effect(record)

    async def list_tool_effects(self, run_id: str) -> list[ToolEffectRecord]:
        return await self.inner.list_tool_effects(run_id)

    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        await self.inner.save_snapshot(snapshot)

    async def list_snapshots(self, run_id: str, *, include_interrupted: bool = False) -> list[ContinuableSnapshot]:
        return await self.inner.list_snapshots(run_id, include_interrupted=include_interrupted)


async def test_a_store_not_built_on_the_engine_is_read_through_its_public_api() -> None:
    media = InMemoryMediaStore()
    inner = MediaMemoryStepStore(media_store=media, media_threshold_bytes=1024)
    store = _NotOnTheEngine(inner)
    await store.register_run(RunRecord(run_id='kept'))
    await store.save_snapshot(
        ContinuableSnapshot(
            run_id='kept', messages=_with_image(b'k' * 2048), state=SnapshotState.INTERRUPTED, step_index=0
        )
    )
    loose = await media.put(b'l' * 2048)
    report = await collect_garbage(store, media, now=utcnow() + LATER)
    assert report.removed_uris == [loose]
    assert (report.runs, report.kept_referenced) == (1, 1)
    assert await media.exists(media_uri(b'k' * 2048))


async def test_an_encrypted_store_is_collected_through_its_keys(tmp_path: Path) -> None:
    # Message bodies are ciphertext at rest: marking must open them with the store's keys to find
    # the references, or every blob of an encrypted store would look unreferenced.
    keys = Encryption(keys={'k1': generate_key()}, active='k1')
    store = SqliteStepStore(database=tmp_path / 'runs.db', media_threshold_bytes=1024, encryption=keys)
    try:
        await store.register_run(RunRecord(run_id='kept'))
        await store.save_snapshot(ContinuableSnapshot(run_id='kept', messages=_with_image(b'k' * 2048), step_index=0))
        await store.register_run(RunRecord(run_id='gone'))
        await store.save_snapshot(ContinuableSnapshot(run_id='gone', messages=_with_image(b'g' * 2048), step_index=0))
        assert await store.delete_run('gone')
        report = await collect_garbage(store, now=utcnow() + LATER)
        assert (report.kept_referenced, report.removed) == (1, 1)
        snapshot = await store.latest_snapshot('kept')
        assert snapshot is not None
        part = cast(UserPromptPart, snapshot.messages[0].parts[0])
        assert cast(list[BinaryContent], part.content)[1].data == b'k' * 2048
    finally:
        await store.aclose()


async def test_a_store_that_cannot_list_its_snapshots_is_refused_before_anything_is_removed() -> None:
    media = InMemoryMediaStore()
    inner = MediaMemoryStepStore(media_store=media, media_threshold_bytes=1024)
    store = ProtocolOnlyStore(inner)  # the reference's ten methods: latest_snapshot, no list_snapshots
    await store.register_run(RunRecord(run_id='kept'))
    await store.save_snapshot(ContinuableSnapshot(run_id='kept', messages=_with_image(b'k' * 2048), step_index=0))
    loose = await media.put(b'l' * 2048)
    with pytest.raises(NotImplementedError, match='implement list_snapshots'):
        await collect_garbage(cast(StepStore, store), media, now=utcnow() + LATER)
    assert await media.exists(loose)


async def test_the_maintenance_defaults_read_the_contract() -> None:
    media = InMemoryMediaStore()
    store = _NotOnTheEngine(MediaMemoryStepStore(media_store=media, media_threshold_bytes=1024))
    await store.register_run(RunRecord(run_id='b'))
    await store.register_run(RunRecord(run_id='a'))
    await store.save_snapshot(ContinuableSnapshot(run_id='a', messages=_with_image(b'k' * 2048), step_index=0))
    assert await store.stored_run_ids() == ['a', 'b']
    assert media_uri(b'k' * 2048) in await store.media_references('a')  # every payload counts: safe
    assert await store.media_references('b') == set()
    assert await store.stored_key_ids('a') == {None}
    assert await store.stored_key_ids('missing') == set()
    assert store.encryption is None
