"""Create the test bucket on an S3-compatible server named by the STEP_S3_* variables.

`scripts/s3-server.sh` creates its bucket at start-up; other servers, such as MinIO in a container,
start empty. Run: `uv run python scripts/s3/create_bucket.py`. An existing bucket is
left as it is.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, cast

from aiobotocore.session import AioSession
from botocore.exceptions import ClientError


async def create_bucket() -> str:
    endpoint = os.environ.get('STEP_S3_ENDPOINT')
    if not endpoint:
        raise SystemExit('STEP_S3_ENDPOINT is not set: export the URL of the S3-compatible server first')
    bucket = os.environ.get('STEP_S3_BUCKET', 'stepcore-test')
    session = AioSession()
    async with session.create_client(  # pyright: ignore[reportUnknownMemberType]
        's3',
        endpoint_url=endpoint,
        region_name='us-east-1',
        aws_access_key_id=os.environ.get('STEP_S3_ACCESS_KEY', 'stepcore-test'),
        aws_secret_access_key=os.environ.get('STEP_S3_SECRET_KEY', 'stepcore-test-secret'),
    ) as raw_client:
        client = cast(Any, raw_client)
        try:
            await client.create_bucket(Bucket=bucket)
        except ClientError as exc:
            code = cast(dict[str, Any], exc.response).get('Error', {}).get('Code')
            if code not in ('BucketAlreadyOwnedByYou', 'BucketAlreadyExists'):
                raise
    return f'bucket {bucket!r} ready at {endpoint}'


if __name__ == '__main__':
    print(asyncio.run(create_bucket()), file=sys.stderr)
