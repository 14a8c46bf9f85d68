"""S3MediaStore passes the media store conformance suite against the test server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from media_s3 import S3MediaStore
from stepcore.media import MediaStore
from stepcore_conformance import MediaDamage, MediaStoreConformance

from .conftest import S3Server


async def _damage(store: MediaStore, uri: str, replacement: bytes) -> None:
    """Overwrite the blob's object with `replacement`, keeping its content type and metadata."""
    assert isinstance(store, S3MediaStore)
    client = await store.client()
    key = store.key_for(uri)
    head = await client.head_object(Bucket=store.bucket, Key=key)
    await client.put_object(
        Bucket=store.bucket,
        Key=key,
        Body=replacement,
        ContentType=head.get('ContentType') or 'binary/octet-stream',
        Metadata=head.get('Metadata') or {},
    )


class _Damage:
    @pytest.fixture
    def media_damage(self) -> MediaDamage:
        return _damage


class TestS3MediaConformance(_Damage, MediaStoreConformance):
    stored_at_resolution = 1.0  # LastModified keeps whole seconds

    @pytest.fixture
    async def media_store(self, s3_server: S3Server) -> AsyncIterator[MediaStore]:
        async with s3_server.store() as store:
            yield store


class TestS3MediaConformanceMultipart(_Damage, MediaStoreConformance):
    """The same suite with every blob of 512 KiB or more sent as a multipart upload."""

    stored_at_resolution = 1.0

    @pytest.fixture
    async def media_store(self, s3_server: S3Server) -> AsyncIterator[MediaStore]:
        async with s3_server.store(multipart_threshold_bytes=512 * 1024) as store:
            yield store
