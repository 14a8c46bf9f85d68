"""The stepcore conformance suite against the PostgreSQL server at STEP_POSTGRES_URL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from step_postgres import PostgresMediaStore, PostgresStepStore
from stepcore.media import MediaStore
from stepcore_conformance import MediaDamage, MediaStoreConformance, StepStoreConformance


class TestPostgresStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(
        self, postgres_url: str, table_prefix: str, store_options: dict[str, Any]
    ) -> AsyncIterator[PostgresStepStore]:
        store = PostgresStepStore(dsn=postgres_url, table_prefix=table_prefix, **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, postgres_url: str, table_prefix: str) -> dict[str, Any]:
        return {'backend': 'postgres', 'dsn': postgres_url, 'table_prefix': table_prefix}

    @pytest.fixture
    def other_store_spec(self, postgres_url: str, new_prefix: Callable[[], str]) -> dict[str, Any]:
        return {'backend': 'postgres', 'dsn': postgres_url, 'table_prefix': new_prefix()}

    @pytest.fixture
    def damage(self, postgres_damage: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        """Record bodies are `json` columns (the kit's replacement is valid JSON); messages are `bytea` nodes."""
        return postgres_damage


class TestPostgresMediaStore(MediaStoreConformance):
    @pytest.fixture
    async def media_store(self, postgres_url: str, table_prefix: str) -> AsyncIterator[PostgresMediaStore]:
        store = PostgresMediaStore(dsn=postgres_url, table_prefix=table_prefix)
        yield store
        await store.aclose()

    @pytest.fixture
    def media_damage(self) -> MediaDamage:
        async def damage(store: MediaStore, uri: str, replacement: bytes) -> None:
            assert isinstance(store, PostgresMediaStore)
            assert store.pool is not None
            query = store.tables.query('UPDATE {media} SET data = %s WHERE digest = %s')
            async with store.pool.connection() as conn:
                cur = await conn.execute(query, (replacement, uri.removeprefix('media+sha256://')))
                assert cur.rowcount == 1, f'no row of {uri} to damage'

        return damage

    @pytest.fixture
    async def gc_step_store(
        self, postgres_url: str, table_prefix: str, media_store: PostgresMediaStore
    ) -> AsyncIterator[PostgresStepStore]:
        """Collection reads the snapshots of a real PostgreSQL step store."""
        store = PostgresStepStore(
            dsn=postgres_url, table_prefix=table_prefix, media_store=media_store, media_threshold_bytes=1024
        )
        yield store
        await store.aclose()
