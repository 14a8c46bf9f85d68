"""The stepcore conformance suite against the Redis server at STEP_REDIS_URL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from step_redis import RedisMediaStore, RedisStepStore
from stepcore.media import MediaStore
from stepcore_conformance import Damage, MediaDamage, MediaStoreConformance, StepStoreConformance


class TestRedisStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(
        self, redis_url: str, key_prefix: str, store_options: dict[str, Any]
    ) -> AsyncIterator[RedisStepStore]:
        store = RedisStepStore(url=redis_url, key_prefix=key_prefix, **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, redis_url: str, key_prefix: str) -> dict[str, Any]:
        return {'backend': 'redis', 'url': redis_url, 'key_prefix': key_prefix}

    @pytest.fixture
    def other_store_spec(self, redis_url: str, new_prefix: Callable[[], str]) -> dict[str, Any]:
        return {'backend': 'redis', 'url': redis_url, 'key_prefix': new_prefix()}

    @pytest.fixture
    def damage(self, redis_damage: Damage) -> Damage:
        """Rows keep their fields NUL-separated: the hook replaces the body, the last field."""
        return redis_damage


class TestRedisMediaStore(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self, redis_url: str, key_prefix: str) -> AsyncIterator[RedisMediaStore]:
        store = RedisMediaStore(url=redis_url, key_prefix=key_prefix)
        yield store
        await store.aclose()

    @pytest.fixture
    def media_damage(self) -> MediaDamage:
        async def damage(store: MediaStore, uri: str, replacement: bytes) -> None:
            assert isinstance(store, RedisMediaStore)
            key = store.keys.media(uri.removeprefix('media+sha256://'))
            assert await store.client.set(key, replacement, xx=True), f'no key of {uri} to damage'

        return damage

    @pytest.fixture
    async def gc_step_store(
        self, redis_url: str, key_prefix: str, media_store: RedisMediaStore
    ) -> AsyncIterator[RedisStepStore]:
        """Collection reads the snapshots of a real Redis step store."""
        store = RedisStepStore(
            url=redis_url, key_prefix=key_prefix, media_store=media_store, media_threshold_bytes=1024
        )
        yield store
        await store.aclose()
