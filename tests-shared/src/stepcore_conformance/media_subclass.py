"""The media subclass section: a subclass of a `MediaEngine` media store with private names of its own.

The media side of `subclass.py`: the kit builds the `media_store` fixture's store as a subclass
that sets `COMMON_PRIVATE_NAMES` for itself (after, then before, `super().__init__`), and it must
still store and read blobs, leaving those names alone. A media store not built on
`stepcore.media.MediaEngine` keeps its own state and is skipped with that reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from stepcore import MediaContext
from stepcore.backend import MediaEngine

from ._support import new_id
from .subclass import ConstructionRecorder, assert_names_kept, subclass_recorder, subclassed

__all__ = ('MediaSubclassConformance',)


class MediaSubclassConformance:
    """A subclass of a `MediaEngine` media store that sets `COMMON_PRIVATE_NAMES` for itself still stores blobs."""

    @pytest.fixture
    def media_store_constructions(self) -> Iterator[ConstructionRecorder]:
        """Records how the `media_store` fixture builds its store (requested before it)."""
        yield from subclass_recorder(MediaEngine)

    @pytest.fixture(params=['after', 'before'], ids=['names-set-after-init', 'names-set-before-init'])
    async def subclassed_media_store(
        self, request: pytest.FixtureRequest, media_store_constructions: ConstructionRecorder, media_store: Any
    ) -> AsyncIterator[Any]:
        """A media store built like the `media_store` fixture's, as its colliding subclass (closed afterwards)."""
        built = subclassed(media_store_constructions, media_store, request.param, 'media_store')
        yield built
        close = getattr(built, 'aclose', None)
        if close is not None:
            await close()

    async def test_a_subclass_with_private_names_of_its_own_keeps_storing_blobs(
        self, subclassed_media_store: Any
    ) -> None:
        media = subclassed_media_store
        assert_names_kept(media)
        data = f'blob of {new_id("media")}'.encode()
        context = MediaContext(media_type='text/plain', metadata={'kind': 'note'})
        uri = await media.put(data, context=context)
        assert await media.exists(uri)
        assert await media.get(uri) == data
        assert dict(await media.get_metadata(uri) or {}) == {'kind': 'note'}
        assert await media.put(data, context=context) == uri
        assert_names_kept(media)
