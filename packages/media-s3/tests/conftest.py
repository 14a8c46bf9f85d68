"""Fixtures reaching the S3-compatible test server named by `STEP_S3_ENDPOINT`.

Start one with `export STEP_S3_ENDPOINT="$(scripts/s3-server.sh start)"` (SeaweedFS, with the
credentials `stepcore-test` / `stepcore-test-secret` that the fixtures default to; set
STEP_S3_ACCESS_KEY / STEP_S3_SECRET_KEY for another server). Without it, or when it does not
answer, every test here fails: a missing server is an error, not a reason to skip.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

from media_s3 import S3MediaStore


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str

    def store(self, **options: Any) -> S3MediaStore:
        options.setdefault('key_prefix', f'tests/{uuid.uuid4().hex}/')
        return S3MediaStore(
            bucket=options.pop('bucket', self.bucket),
            endpoint=options.pop('endpoint', self.endpoint),
            region='us-east-1',
            access_key_id=options.pop('access_key_id', self.access_key),
            secret_access_key=options.pop('secret_access_key', self.secret_key),
            **options,
        )


@pytest.fixture(scope='session')
def s3_server() -> S3Server:
    endpoint = os.environ.get('STEP_S3_ENDPOINT', '')
    if not endpoint:
        pytest.fail(
            'STEP_S3_ENDPOINT is not set: start the test server with '
            '`export STEP_S3_ENDPOINT="$(scripts/s3-server.sh start)"` (or run scripts/test.sh)',
            pytrace=False,
        )
    parts = urlsplit(endpoint)
    host, port = parts.hostname or '', parts.port or (443 if parts.scheme == 'https' else 80)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        pytest.fail(
            f'STEP_S3_ENDPOINT={endpoint} does not answer ({exc}): is scripts/s3-server.sh running?', pytrace=False
        )
    return S3Server(
        endpoint=endpoint,
        access_key=os.environ.get('STEP_S3_ACCESS_KEY', 'stepcore-test'),
        secret_key=os.environ.get('STEP_S3_SECRET_KEY', 'stepcore-test-secret'),
        bucket=os.environ.get('STEP_S3_BUCKET', 'stepcore-test'),
    )


@pytest.fixture
async def s3_store(s3_server: S3Server) -> AsyncIterator[S3MediaStore]:
    """A store writing under a fresh key prefix, so each test starts from an empty namespace."""
    async with s3_server.store() as store:
        yield store
