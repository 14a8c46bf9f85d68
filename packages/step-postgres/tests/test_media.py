"""PostgresMediaStore on its own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from step_postgres import PostgresMediaStore
from stepcore.media import MediaContext, media_uri


@pytest.fixture
async def media(postgres_url: str, table_prefix: str) -> AsyncIterator[PostgresMediaStore]:
    store = PostgresMediaStore(
        dsn=postgres_url, table_prefix=table_prefix, public_url=lambda uri, ctx: f'https://cdn.test/{uri[-64:]}'
    )
    yield store
    await store.aclose()


async def test_round_trip_and_dedup(media: PostgresMediaStore) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB, stored out of line by PostgreSQL
    ctx = MediaContext(media_type='application/octet-stream', metadata={'source': 'test', 'ü': 'ö'})
    uri = await media.put(data, context=ctx)
    assert uri == media_uri(data)
    assert await media.put(data, context=MediaContext(metadata={'other': 'x'})) == uri  # stored once
    assert await media.get(uri) == data
    assert await media.exists(uri)
    assert await media.get_metadata(uri) == {'source': 'test', 'ü': 'ö'}  # the first put's metadata stays
    assert await media.public_url(uri) == f'https://cdn.test/{uri[-64:]}'


async def test_missing_and_malformed_uris(media: PostgresMediaStore) -> None:
    absent = media_uri(b'never stored')
    assert not await media.exists(absent)
    with pytest.raises(LookupError, match='media not found'):
        await media.get(absent)
    with pytest.raises(LookupError, match='media not found'):
        await media.get_metadata(absent)
    with pytest.raises(ValueError, match='is not a media'):
        await media.get('https://example.invalid/x')
    uri = await media.put(b'')
    assert await media.get(uri) == b''
    assert await media.get_metadata(uri) is None


async def test_without_resolver_public_url_is_none(postgres_url: str, table_prefix: str) -> None:
    store = PostgresMediaStore(dsn=postgres_url, table_prefix=table_prefix)
    try:
        assert await store.public_url(await store.put(b'x')) is None
    finally:
        await store.aclose()
