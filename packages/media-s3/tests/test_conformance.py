"""S3MediaStore passes the media store conformance suite against the test server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from stepcore.media import MediaStore
from stepcore_conformance import MediaStoreConformance

from .conftest import S3Server


class TestS3MediaConformance(MediaStoreConformance):
    stored_at_resolution = 1.0  # LastModified keeps whole seconds

    @pytest.fixture
    async def media_store(self, s3_server: S3Server) -> AsyncIterator[MediaStore]:
        async with s3_server.store() as store:
            yield store


class TestS3MediaConformanceMultipart(MediaStoreConformance):
    """The same suite with every blob of 512 KiB or more sent as a multipart upload."""

    stored_at_resolution = 1.0

    @pytest.fixture
    async def media_store(self, s3_server: S3Server) -> AsyncIterator[MediaStore]:
        async with s3_server.store(multipart_threshold_bytes=512 * 1024) as store:
            yield store
