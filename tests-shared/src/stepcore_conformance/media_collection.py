"""Garbage collection of media (feature `media_collection` of a media store).

`stepcore.maintenance.gc.collect_garbage` against the media store under test: referenced blobs survive,
unreferenced old ones go, young ones stay, a `put` of bytes already stored makes the blob young
again (also while a removal is under way), a dry run removes nothing, and the media of a deleted
run become collectable, including those of a real `Agent` run holding an image.

The snapshots referencing the media are kept by the `gc_step_store` fixture: by default an
in-memory step store externalizing into the media store under test (override it to use your own
step store). Blobs are made "old" by passing `now=` to `collect_garbage`, never by waiting; the
only pause is `stored_at_resolution`, for a store whose times are coarse (S3 keeps whole seconds).
"""

from __future__ import annotations

import operator
import random
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar, cast

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo

from stepcore import (
    ContinuableSnapshot,
    GcReport,
    InMemoryStepStore,
    MediaStore,
    RunRecord,
    SnapshotState,
    StepPersistence,
    StepStore,
    collect_garbage,
)
from stepcore.backend import (
    MEDIA_COLLECTION,
    MEDIA_EXTERNALIZATION,
    SNAPSHOT_RETENTION,
    CollectableMediaStore,
    media_uri,
    utcnow,
)

from ._declared import feature_test, require_feature_declared
from ._support import new_id
from .capability import function_model

__all__ = ('MediaCollectionConformance', 'MediaMemoryStepStore')

THRESHOLD = 1024
LATER = timedelta(days=1)
"""How far past a blob's put `now=` is set to make it old."""


class MediaMemoryStepStore(InMemoryStepStore):
    """The in-memory step store, externalizing media into a given media store."""

    features: ClassVar[frozenset[str]] = frozenset({SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION})


def _blob(tag: str, size: int = 2048) -> bytes:
    return f'{tag}:'.encode() + random.Random().randbytes(size)


def _image_request(data: bytes) -> ModelRequest:
    image = cast(Callable[..., BinaryContent], BinaryContent)(data=data, media_type='image/png')
    return ModelRequest(parts=[UserPromptPart(['what is this?', image])])


def _collectable(media_store: MediaStore) -> CollectableMediaStore:
    require_feature_declared(media_store, MEDIA_COLLECTION)
    return cast(CollectableMediaStore, media_store)


def _image_of(snapshot: ContinuableSnapshot | None) -> bytes:
    assert snapshot is not None
    part = snapshot.messages[-1].parts[0]
    assert isinstance(part, UserPromptPart)
    assert not isinstance(part.content, str)
    image = part.content[-1]
    assert isinstance(image, BinaryContent)
    return cast(bytes, operator.attrgetter('data')(image))  # pyright reads BinaryContent as a bare dataclass


async def _stored(media: CollectableMediaStore) -> dict[str, Any]:
    return {blob.uri: blob async for blob in media.list_media()}


class MediaCollectionConformance:
    """`collect_garbage` over the media store under test (its `media_store` fixture)."""

    stored_at_resolution: ClassVar[float] = 0.0
    """Seconds to pause between two puts that must get different times (S3: 1.0, it keeps whole seconds)."""

    @pytest.fixture
    async def gc_step_store(self, media_store: MediaStore) -> AsyncIterator[StepStore]:
        """The step store whose snapshots reference blobs of `media_store` (override to use your own)."""
        store = MediaMemoryStepStore(media_store=media_store, media_threshold_bytes=THRESHOLD)
        yield store
        await store.aclose()

    async def _pause(self) -> None:
        if self.stored_at_resolution:
            await anyio.sleep(self.stored_at_resolution)

    async def _save_image(self, store: StepStore, data: bytes, run_id: str | None = None) -> str:
        run_id = run_id or new_id('gc-run')
        await store.register_run(RunRecord(run_id=run_id))
        await store.save_snapshot(ContinuableSnapshot(run_id=run_id, step_index=0, messages=[_image_request(data)]))
        return run_id

    @feature_test(MEDIA_COLLECTION)
    async def test_list_media_lists_each_blob_once(self, media_store: MediaStore) -> None:
        media = _collectable(media_store)
        before = utcnow() - timedelta(seconds=self.stored_at_resolution)
        first, second = _blob('list-a'), _blob('list-b', 100)
        uris = [await media.put(first), await media.put(second), await media.put(first)]
        listed = [blob async for blob in media.list_media()]
        mine = [blob for blob in listed if blob.uri in uris]
        assert sorted(blob.uri for blob in mine) == sorted({uris[0], uris[1]})
        sizes = {blob.uri: blob.size for blob in mine}
        assert sizes == {media_uri(first): len(first), media_uri(second): len(second)}
        after = utcnow() + timedelta(seconds=self.stored_at_resolution)
        for blob in mine:
            assert blob.stored_at.tzinfo is not None, 'stored_at must be an aware datetime'
            assert before <= blob.stored_at <= after, f'stored_at {blob.stored_at} is not the time of the put'

    @feature_test(MEDIA_COLLECTION)
    async def test_referenced_blobs_survive_and_unreferenced_old_ones_go(
        self, media_store: MediaStore, gc_step_store: StepStore
    ) -> None:
        media = _collectable(media_store)
        kept, loose = _blob('referenced'), _blob('unreferenced')
        run_id = await self._save_image(gc_step_store, kept)
        loose_uri = await media.put(loose)
        report = await collect_garbage(gc_step_store, media, now=utcnow() + LATER)
        assert report.removed_uris == [loose_uri]
        assert (report.removed, report.bytes_freed, report.kept_referenced) == (1, len(loose), 1)
        assert (report.referenced, report.missing) == (1, 0)
        assert report.runs >= 1
        assert not await media.exists(loose_uri)
        assert await media.exists(media_uri(kept))
        assert _image_of(await gc_step_store.latest_snapshot(run_id=run_id)) == kept

    @feature_test(MEDIA_COLLECTION)
    async def test_young_blobs_stay(self, media_store: MediaStore, gc_step_store: StepStore) -> None:
        media = _collectable(media_store)
        uri = await media.put(_blob('young'))
        report = await collect_garbage(gc_step_store, media, grace=timedelta(hours=1))
        assert (report.removed, report.kept_young) == (0, 1)
        assert await media.exists(uri)

    @feature_test(MEDIA_COLLECTION)
    async def test_a_put_of_stored_bytes_makes_the_blob_young_again(
        self, media_store: MediaStore, gc_step_store: StepStore
    ) -> None:
        """The race a concurrent writer runs: it puts an old, unreferenced blob (dedupe) for a
        snapshot it has not saved yet, just before the collection: the blob survives."""
        media = _collectable(media_store)
        again, left = _blob('put-again'), _blob('left-alone')
        again_uri, left_uri = await media.put(again), await media.put(left)
        await self._pause()
        cutoff = utcnow()
        await self._pause()
        assert await media.put(again) == again_uri
        report = await collect_garbage(gc_step_store, media, grace=timedelta(0), now=cutoff)
        assert report.removed_uris == [left_uri]
        assert await media.get(again_uri) == again
        assert not await media.exists(left_uri)

    @feature_test(MEDIA_COLLECTION)
    async def test_delete_media_keeps_a_blob_put_again_after_it_was_listed(self, media_store: MediaStore) -> None:
        media = _collectable(media_store)
        data = _blob('listed-then-put')
        uri = await media.put(data)
        await self._pause()
        cutoff = utcnow()
        listed = (await _stored(media))[uri]
        assert listed.stored_at < cutoff
        await self._pause()
        await media.put(data)  # a writer, between the listing and the removal
        assert await media.delete_media(uri, older_than=cutoff) is False
        assert await media.get(uri) == data
        assert await media.delete_media(uri, older_than=utcnow() + LATER) is True
        assert not await media.exists(uri)
        with pytest.raises(LookupError):
            await media.get(uri)
        assert await media.delete_media(uri) is False
        assert await media.put(data) == uri  # and it can be stored again
        assert await media.get(uri) == data

    @feature_test(MEDIA_COLLECTION)
    async def test_dry_run_removes_nothing(self, media_store: MediaStore, gc_step_store: StepStore) -> None:
        media = _collectable(media_store)
        data = _blob('dry')
        uri = await media.put(data)
        report = await collect_garbage(gc_step_store, media, dry_run=True, now=utcnow() + LATER)
        assert report.dry_run
        assert (report.removed_uris, report.bytes_freed) == ([uri], len(data))
        assert await media.exists(uri)
        real = await collect_garbage(gc_step_store, media, now=utcnow() + LATER)
        assert real.removed_uris == [uri]
        assert not await media.exists(uri)

    @feature_test(MEDIA_COLLECTION)
    async def test_a_deleted_runs_blobs_become_collectable(
        self, media_store: MediaStore, gc_step_store: StepStore
    ) -> None:
        media = _collectable(media_store)
        mine, shared = _blob('deleted-run'), _blob('shared')
        doomed = await self._save_image(gc_step_store, mine)
        await gc_step_store.save_snapshot(
            ContinuableSnapshot(run_id=doomed, step_index=0, messages=[_image_request(mine), _image_request(shared)])
        )
        survivor = await self._save_image(gc_step_store, shared)  # the same bytes, stored once (dedupe)
        assert (await collect_garbage(gc_step_store, media, now=utcnow() + LATER)).removed == 0
        assert await gc_step_store.delete_run(doomed)
        report = await collect_garbage(gc_step_store, media, now=utcnow() + LATER)
        assert report.removed_uris == [media_uri(mine)]
        assert await media.exists(media_uri(shared))
        assert _image_of(await gc_step_store.latest_snapshot(run_id=survivor)) == shared

    @feature_test(MEDIA_COLLECTION)
    async def test_interrupted_and_older_snapshots_hold_their_media(
        self, media_store: MediaStore, gc_step_store: StepStore
    ) -> None:
        media = _collectable(media_store)
        older, interrupted = _blob('older-snapshot'), _blob('interrupted-snapshot')
        run_id = await self._save_image(gc_step_store, older)
        await gc_step_store.save_snapshot(
            ContinuableSnapshot(
                run_id=run_id,
                step_index=1,
                messages=[ModelRequest(parts=[UserPromptPart('later')])],
                state=SnapshotState.INTERRUPTED,
            )
        )
        await gc_step_store.save_snapshot(
            ContinuableSnapshot(
                run_id=run_id, step_index=2, messages=[_image_request(interrupted)], state=SnapshotState.INTERRUPTED
            )
        )
        report = await collect_garbage(gc_step_store, media, now=utcnow() + LATER)
        assert report.removed == 0
        assert await media.exists(media_uri(older))
        assert await media.exists(media_uri(interrupted))

    @feature_test(MEDIA_COLLECTION)
    async def test_an_agent_runs_image_is_collected_once_the_run_is_deleted(
        self, media_store: MediaStore, gc_step_store: StepStore
    ) -> None:
        media = _collectable(media_store)
        image = _blob('agent-image', 4096)

        def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            return ModelResponse(parts=[TextPart('a picture of noise')])

        agent = Agent(function_model(respond), capabilities=[StepPersistence(store=gc_step_store)])
        result = await agent.run(
            ['what is this?', cast(Callable[..., BinaryContent], BinaryContent)(data=image, media_type='image/png')]
        )
        uri = media_uri(image)
        assert await media.exists(uri), 'the image was not externalized into the media store'
        kept = await collect_garbage(gc_step_store, media, now=utcnow() + LATER)
        assert kept.removed == 0
        assert kept.kept_referenced >= 1
        assert await gc_step_store.delete_run(result.run_id)
        report = await collect_garbage(gc_step_store, media, now=utcnow() + LATER)
        assert uri in report.removed_uris
        assert not await media.exists(uri)

    @feature_test(MEDIA_COLLECTION)
    async def test_reports_add_up(self, media_store: MediaStore, gc_step_store: StepStore) -> None:
        media = _collectable(media_store)
        await self._save_image(gc_step_store, _blob('counted'))
        for n in range(3):
            await media.put(_blob(f'loose-{n}'))
        listed = len(await _stored(media))
        report: GcReport = await collect_garbage(gc_step_store, media, dry_run=True, now=utcnow() + LATER)
        assert report.kept + report.removed == listed
        assert (report.removed, report.kept_referenced) == (3, 1)

    async def test_a_bad_grace_is_refused(self, media_store: MediaStore, gc_step_store: StepStore) -> None:
        media = _collectable(media_store)
        with pytest.raises(ValueError, match='grace'):
            await collect_garbage(gc_step_store, media, grace=timedelta(seconds=-1))
        naive = cast(Any, datetime(2030, 1, 1))  # the mistake under test
        with pytest.raises(ValueError, match='aware'):
            await collect_garbage(gc_step_store, media, now=naive)
