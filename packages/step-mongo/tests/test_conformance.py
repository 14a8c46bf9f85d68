"""The stepcore conformance suite against the MongoDB server at STEP_MONGO_URL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from step_mongo import MongoMediaStore, MongoStepStore
from step_mongo.client import MongoClient
from stepcore_conformance import MediaDamage, MediaStoreConformance, StepStoreConformance


class TestMongoStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(self, mongo_url: str, db_name: str, store_options: dict[str, Any]) -> AsyncIterator[MongoStepStore]:
        store = MongoStepStore(db_url=mongo_url, database=db_name, **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, mongo_url: str, db_name: str) -> dict[str, Any]:
        return {'backend': 'mongo', 'db_url': mongo_url, 'database': db_name}

    @pytest.fixture
    async def other_store_spec(self, mongo_url: str, mongo_client: MongoClient) -> AsyncIterator[dict[str, Any]]:
        name = f'stepcore_test_{uuid.uuid4().hex}'
        yield {'backend': 'mongo', 'db_url': mongo_url, 'database': name}
        await mongo_client.drop_database(name)

    @pytest.fixture
    def damage(self, mongo_damage: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        return mongo_damage


class TestMongoMediaStore(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self, mongo_url: str, db_name: str) -> AsyncIterator[MongoMediaStore]:
        store = MongoMediaStore(db_url=mongo_url, database=db_name)
        yield store
        await store.aclose()

    @pytest.fixture
    def media_damage(self, mongo_media_damage: MediaDamage) -> MediaDamage:
        return mongo_media_damage

    @pytest.fixture
    async def gc_step_store(
        self, mongo_url: str, db_name: str, media_store: MongoMediaStore
    ) -> AsyncIterator[MongoStepStore]:
        """Collection reads the snapshots of a real MongoDB step store."""
        store = MongoStepStore(db_url=mongo_url, database=db_name, media_store=media_store, media_threshold_bytes=1024)
        yield store
        await store.aclose()
