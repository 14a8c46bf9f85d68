"""SqliteMediaStore: rows, dedup, metadata and media type columns, public URLs."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from step_sqlite import SqliteMediaStore
from stepcore.media import MediaContext


async def test_put_stores_one_row_per_content_with_metadata_and_media_type(tmp_path: Path) -> None:
    db = tmp_path / 'media.db'
    store = SqliteMediaStore(database=db)
    try:
        context = MediaContext(media_type='image/png', metadata={'source': 'camera', 'ü': 'ß'})
        uri = await store.put(b'pixels', context=context)
        assert uri == 'media+sha256://' + hashlib.sha256(b'pixels').hexdigest()
        assert await store.put(b'pixels', context=MediaContext(media_type='text/plain')) == uri
        with sqlite3.connect(db) as raw:
            rows = raw.execute('SELECT digest, data, size, media_type, metadata FROM media').fetchall()
        assert len(rows) == 1
        digest, data, size, media_type, metadata = rows[0]
        assert (digest, bytes(data), size, media_type) == (
            uri.removeprefix('media+sha256://'),
            b'pixels',
            6,
            'image/png',
        )
        assert isinstance(metadata, str)
        assert await store.get(uri) == b'pixels'
        assert await store.exists(uri)
        assert await store.get_metadata(uri) == {'source': 'camera', 'ü': 'ß'}
    finally:
        await store.aclose()


async def test_metadata_is_none_when_stored_without_any(tmp_path: Path) -> None:
    store = SqliteMediaStore(database=tmp_path / 'media.db')
    try:
        uri = await store.put(b'')
        assert await store.get(uri) == b''
        assert await store.get_metadata(uri) is None
    finally:
        await store.aclose()


async def test_missing_and_malformed_uris(tmp_path: Path) -> None:
    store = SqliteMediaStore(database=tmp_path / 'media.db')
    missing = 'media+sha256://' + 'a' * 64
    try:
        assert not await store.exists(missing)
        with pytest.raises(LookupError, match='media not found'):
            await store.get(missing)
        with pytest.raises(ValueError, match='is not a media'):
            await store.get('s3://bucket/key')
    finally:
        await store.aclose()


async def test_public_url_uses_the_resolver(tmp_path: Path) -> None:
    async def resolver(uri: str, context: MediaContext) -> str:
        return f'https://cdn.invalid/{uri.removeprefix("media+sha256://")}?type={context.media_type}'

    store = SqliteMediaStore(database=tmp_path / 'media.db', public_url=resolver)
    plain = SqliteMediaStore(database=tmp_path / 'media.db')
    try:
        uri = await store.put(b'x')
        url = await store.public_url(uri, context=MediaContext(media_type='image/gif'))
        assert url == f'https://cdn.invalid/{uri.removeprefix("media+sha256://")}?type=image/gif'
        assert await plain.public_url(uri) is None
    finally:
        await store.aclose()
        await plain.aclose()


async def test_table_option_moves_the_rows_and_is_validated(tmp_path: Path) -> None:
    db = tmp_path / 'media.db'
    store = SqliteMediaStore(database=db, table='blobs')
    try:
        uri = await store.put(b'abc')
        with sqlite3.connect(db) as raw:
            assert raw.execute('SELECT COUNT(*) FROM blobs').fetchone()[0] == 1
        assert await store.get(uri) == b'abc'
    finally:
        await store.aclose()
    with pytest.raises(ValueError, match='not a usable table name'):
        SqliteMediaStore(database=db, table='media; DROP TABLE x')


async def test_a_shared_connection_is_not_closed(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / 'app.db', check_same_thread=False)
    try:
        store = SqliteMediaStore(connection=connection)
        uri = await store.put(b'shared')
        await store.aclose()
        digest = uri.removeprefix('media+sha256://')
        assert connection.execute('SELECT data FROM media WHERE digest = ?', (digest,)).fetchone()[0] == b'shared'
    finally:
        connection.close()
