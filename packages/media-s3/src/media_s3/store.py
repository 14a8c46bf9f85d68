"""`S3MediaStore`: content-addressed blobs in an S3-compatible bucket (AWS S3, Cloudflare R2, MinIO).

Requests go through aiobotocore, so signing (SigV4), retries and the credential chain (explicit
keys, else environment variables, shared config/credentials files, profiles, container and
instance roles) are botocore's. One client per store is opened on first use and closed by
`aclose()` or `async with`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, ClassVar, Literal, NoReturn, Self, cast
from urllib.parse import urlsplit

from aiobotocore.session import AioSession
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from media_s3.client import S3Client
from media_s3.errors import S3AccessDeniedError, S3BucketNotFoundError, S3EndpointUnreachableError, S3MediaError
from media_s3.metadata import decode_metadata, encode_metadata
from stepcore.backend import (
    EMPTY_CONTEXT,
    MEDIA_COLLECTION,
    PERSISTENT,
    BlobHead,
    BlobMeta,
    BlobPort,
    BlobRef,
    KeyStrategy,
    ListedBlob,
    MediaContext,
    MediaEngine,
    PublicUrlResolver,
    default_key,
    digest_in_name,
    strategy_key,
)

__all__ = ('DEFAULT_MULTIPART_THRESHOLD_BYTES', 'DEFAULT_PART_BYTES', 'S3MediaStore')

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
DEFAULT_MULTIPART_THRESHOLD_BYTES = 16 * MiB
"""Blobs at or above this size upload as multipart uploads."""
DEFAULT_PART_BYTES = 8 * MiB
"""Size of each multipart part (S3 allows 5 MiB to 5 GiB per part, except the last)."""
MIN_PART_BYTES = 5 * MiB
MAX_PART_BYTES = 5 * 1024 * MiB
MAX_PARTS = 10_000
MAX_KEY_BYTES = 1024
READ_CHUNK_BYTES = 1 * MiB

_ACCESS_CODES = frozenset(
    {
        'AccessDenied',
        'AllAccessDisabled',
        'AuthorizationHeaderMalformed',
        'ExpiredToken',
        'InvalidAccessKeyId',
        'InvalidToken',
        'SignatureDoesNotMatch',
        'TokenRefreshRequired',
        '401',
        '403',
    }
)
_MISSING_KEY_CODES = frozenset({'NoSuchKey', 'NotFound', '404'})
_LIST_PAGE = 1000

AddressingStyle = Literal['path', 'virtual', 'auto']

_thread_state = threading.local()


def _shared_session() -> AioSession:
    """One session per thread for stores with explicit keys: it caches botocore's loaded service model.

    Stores relying on the credential chain get a session of their own, since a session keeps the
    credentials it resolved first.
    """
    session: AioSession | None = getattr(_thread_state, 'session', None)
    if session is None:
        session = _thread_state.session = AioSession()
    return session


def _error_code(exc: ClientError) -> tuple[str, int | None, str]:
    response = cast(Mapping[str, Any], exc.response)
    error = cast(Mapping[str, Any], response.get('Error', {}))
    metadata = cast(Mapping[str, Any], response.get('ResponseMetadata', {}))
    status = metadata.get('HTTPStatusCode')
    return str(error.get('Code', '')), status if isinstance(status, int) else None, str(error.get('Message', ''))


@dataclass(frozen=True, slots=True)
class _Credentials:
    """What the client signs with: explicit keys, a profile, or neither (botocore's credential chain)."""

    access_key_id: str | None
    secret_access_key: str | None = field(repr=False)
    session_token: str | None = field(repr=False)
    profile: str | None


class _S3Blobs(BlobPort):
    """The blob port of `S3MediaStore`: one object per blob, through a client opened on first use."""

    def __init__(
        self,
        *,
        bucket: str,
        endpoint: str | None,
        region: str | None,
        key_prefix: str,
        key_strategy: KeyStrategy,
        multipart_threshold_bytes: int,
        multipart_part_bytes: int,
        multipart_concurrency: int,
        credentials: _Credentials,
        config: Config,
    ) -> None:
        self.bucket = bucket
        self.endpoint = endpoint
        self.region = region
        self.key_prefix = key_prefix
        self.multipart_threshold_bytes = multipart_threshold_bytes
        self.multipart_part_bytes = multipart_part_bytes
        self.multipart_concurrency = multipart_concurrency
        self.__key_strategy = key_strategy
        self.__credentials = credentials
        self.__config = config
        self.__client: S3Client | None = None
        self.__exit_stack: AsyncExitStack | None = None
        self.__loop: asyncio.AbstractEventLoop | None = None
        self.__open_lock = asyncio.Lock()
        self.__bucket_confirmed = False

    def describe(self) -> str:
        """The store as its repr names it (never a secret)."""
        return f'S3MediaStore(bucket={self.bucket!r}, endpoint={self.__where!r}, key_prefix={self.key_prefix!r})'

    @property
    def __where(self) -> str:
        return self.endpoint or f'AWS S3 ({self.region or "default region"})'

    # -- client lifecycle -------------------------------------------------------------------------

    async def client(self) -> S3Client:
        """The store's aiobotocore S3 client, opened on first use (e.g. for `generate_presigned_url`)."""
        loop = asyncio.get_running_loop()
        client = self.__client
        if client is None:
            async with self.__open_lock:
                client = self.__client
                if client is None:
                    client = await self.__open(loop)
        if self.__loop is not loop:
            state = 'a closed' if self.__loop is not None and self.__loop.is_closed() else 'another'
            raise RuntimeError(
                f'{self.describe()} holds a client opened on {state} event loop: call `await store.aclose()` before '
                'that loop ends (then the store reopens on the next loop), or use one store per event loop'
            )
        return client

    async def __open(self, loop: asyncio.AbstractEventLoop) -> S3Client:
        stack = AsyncExitStack()
        with self.__translate('open a client for'):
            if self.__credentials.profile is not None:
                session = AioSession(profile=self.__credentials.profile)
            elif self.__credentials.access_key_id is not None:
                session = _shared_session()
            else:
                session = AioSession()
            raw_client: object = await stack.enter_async_context(
                session.create_client(  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
                    's3',
                    endpoint_url=self.endpoint,
                    region_name=self.region,
                    aws_access_key_id=self.__credentials.access_key_id,
                    aws_secret_access_key=self.__credentials.secret_access_key,
                    aws_session_token=self.__credentials.session_token,
                    config=self.__config,
                )
            )
        client = cast(S3Client, raw_client)
        self.__client, self.__exit_stack, self.__loop = client, stack, loop
        return client

    async def aclose(self) -> None:
        """Close the client and its connections; a later call opens a new one."""
        stack, self.__exit_stack, self.__client, self.__loop = self.__exit_stack, None, None, None
        self.__bucket_confirmed = False
        self.__open_lock = asyncio.Lock()  # a lock binds to the loop it first waited on
        if stack is not None:
            await stack.aclose()

    # -- keys -------------------------------------------------------------------------------------

    def key_for(self, uri: str, context: MediaContext = EMPTY_CONTEXT) -> str:
        """The object key of `uri`: `key_prefix` plus the key strategy's result."""
        key = self.key_prefix + strategy_key(self.__key_strategy, BlobRef.of(uri, context))
        if len(key.encode('utf-8')) > MAX_KEY_BYTES:
            raise ValueError(f'object key for {uri!r} is over {MAX_KEY_BYTES} bytes, the S3 limit: shorten key_prefix')
        return key

    def where(self) -> str:
        return f'bucket {self.bucket!r} at {self.__where}'

    async def put(self, ref: BlobRef, data: bytes, meta: BlobMeta, stored_us: int) -> None:
        # The service's clock stamps the object (LastModified): `stored_us` is not sent.
        key = self.key_for(ref.uri, ref.context)
        metadata = encode_metadata(meta.metadata)
        try:
            head = await self.__head(key)
            if head is not None and await self.__refresh(key, head):
                return
        except S3AccessDeniedError:
            # AWS answers 403 rather than 404 for a missing object when the credentials lack
            # s3:ListBucket. Upload anyway: credentials that are really wrong fail the upload too,
            # with the service's own error code.
            pass
        extra: dict[str, Any] = {}
        if meta.media_type:
            extra['ContentType'] = meta.media_type
        if metadata:
            extra['Metadata'] = metadata
        client = await self.client()
        with self.__translate('upload', key):
            if len(data) >= self.multipart_threshold_bytes:
                await self.__put_multipart(client, key, data, extra)
            else:
                await client.put_object(Bucket=self.bucket, Key=key, Body=data, **extra)
        self.__bucket_confirmed = True

    async def __refresh(self, key: str, head: Mapping[str, Any]) -> bool:
        """Move an existing object's `LastModified` to now by copying it onto itself; `False` when it is gone."""
        extra: dict[str, Any] = {}
        if head.get('ContentType'):
            extra['ContentType'] = head['ContentType']
        client = await self.client()
        with self.__translate('refresh', key):
            try:
                await client.copy_object(
                    Bucket=self.bucket,
                    Key=key,
                    CopySource={'Bucket': self.bucket, 'Key': key},
                    MetadataDirective='REPLACE',
                    Metadata=dict(cast(Mapping[str, str], head.get('Metadata') or {})),
                    **extra,
                )
            except ClientError as exc:
                code, status, _ = _error_code(exc)
                if code in _MISSING_KEY_CODES or status == 404:
                    return False  # removed since the HEAD: upload it again
                raise
        return True

    async def get(self, ref: BlobRef) -> bytes | None:
        key = self.key_for(ref.uri, ref.context)
        client = await self.client()
        with self.__translate('download', key):
            try:
                response = await client.get_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                code, status, _ = _error_code(exc)
                if code in _MISSING_KEY_CODES or (status == 404 and code != 'NoSuchBucket'):
                    return None
                raise
            self.__bucket_confirmed = True
            body = response['Body']
            chunks: list[bytes] = []
            async with body:
                async for chunk in body.iter_chunks(READ_CHUNK_BYTES):
                    chunks.append(chunk)
        return b''.join(chunks)

    async def head(self, ref: BlobRef) -> BlobHead | None:
        head = await self.__head(self.key_for(ref.uri, ref.context))
        if head is None:
            return None
        return BlobHead(metadata=decode_metadata(cast(Mapping[str, str], head.get('Metadata') or {})))

    async def list(self) -> AsyncIterator[ListedBlob]:
        client = await self.client()
        token: str | None = None
        while True:
            extra: dict[str, Any] = {'ContinuationToken': token} if token else {}
            with self.__translate('list'):
                page = await client.list_objects_v2(
                    Bucket=self.bucket, Prefix=self.key_prefix, MaxKeys=_LIST_PAGE, **extra
                )
            for item in cast(list[Mapping[str, Any]], page.get('Contents') or []):
                key = cast(str, item['Key'])
                digest = digest_in_name(key[len(self.key_prefix) :])
                if digest is None:
                    continue  # not a blob of this store
                stored_at = cast(datetime, item['LastModified']).astimezone(UTC)
                yield ListedBlob(digest=digest, stored_at=stored_at, size=int(item.get('Size', 0)), location=key)
            token = cast(str | None, page.get('NextContinuationToken'))
            if not page.get('IsTruncated') or not token:
                return

    async def delete(self, ref: BlobRef, location: object, older_than: datetime | None) -> bool:
        # S3 has no delete-if-unchanged: a put landing between the HEAD and the delete loses its blob.
        key = location if isinstance(location, str) else self.key_for(ref.uri)
        head = await self.__head(key)
        if head is None:
            return False
        if older_than is not None and cast(datetime, head['LastModified']) >= older_than:
            return False
        client = await self.client()
        with self.__translate('delete', key):
            await client.delete_object(Bucket=self.bucket, Key=key)
        return True

    # -- internals --------------------------------------------------------------------------------

    async def __head(self, key: str) -> dict[str, Any] | None:
        """The HEAD response of `key`, `None` when the object does not exist."""
        client = await self.client()
        with self.__translate('look up', key):
            try:
                head = await client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                code, status, _ = _error_code(exc)
                if status != 404 and code not in _MISSING_KEY_CODES:
                    raise
                await self.__confirm_bucket(client)
                return None
        self.__bucket_confirmed = True
        return head

    async def __confirm_bucket(self, client: S3Client) -> None:
        """After a 404 on an object HEAD (which cannot tell a missing key from a missing bucket)."""
        if self.__bucket_confirmed:
            return
        try:
            await client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code, status, _ = _error_code(exc)
            if status == 404 or code in ('NoSuchBucket', 'NotFound', '404'):
                self.__raise_no_bucket(exc)
            if status == 403 or code in ('AccessDenied', '403'):
                # Credentials valid for objects but not for the bucket itself: nothing more to learn.
                self.__bucket_confirmed = True
                return
            raise
        self.__bucket_confirmed = True

    def __raise_no_bucket(self, exc: Exception) -> NoReturn:
        raise S3BucketNotFoundError(
            f'bucket {self.bucket!r} does not exist at {self.__where}: '
            'create it, or pass the name of an existing bucket',
            bucket=self.bucket,
            endpoint=self.__where,
        ) from exc

    async def __put_multipart(self, client: S3Client, key: str, data: bytes, extra: dict[str, Any]) -> None:
        part_bytes = max(self.multipart_part_bytes, math.ceil(len(data) / MAX_PARTS))
        created = await client.create_multipart_upload(Bucket=self.bucket, Key=key, **extra)
        upload_id = cast(str, created['UploadId'])
        view = memoryview(data)
        limit = asyncio.Semaphore(self.multipart_concurrency)

        async def upload(number: int, start: int) -> dict[str, Any]:
            async with limit:
                part = await client.upload_part(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=bytes(view[start : start + part_bytes]),
                )
            return {'PartNumber': number, 'ETag': part['ETag']}

        try:
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [
                        group.create_task(upload(number, start))
                        for number, start in enumerate(range(0, len(data), part_bytes), start=1)
                    ]
            except BaseExceptionGroup as failures:
                raise failures.exceptions[0] from None
            await client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={'Parts': [task.result() for task in tasks]},
            )
        except BaseException:
            try:
                await client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except Exception as abort_error:
                logger.warning(
                    'could not abort multipart upload %s of s3://%s/%s at %s (%s); '
                    'a bucket lifecycle rule for incomplete uploads removes its parts',
                    upload_id,
                    self.bucket,
                    key,
                    self.__where,
                    abort_error,
                )
            raise

    @contextmanager
    def __translate(self, action: str, key: str | None = None) -> Iterator[None]:
        """Turn botocore failures into errors that name the bucket and endpoint (never a secret)."""
        target = f's3://{self.bucket}/{key}' if key is not None else f'bucket {self.bucket!r}'
        try:
            yield
        except ClientError as exc:
            code, status, message = _error_code(exc)
            if code == 'NoSuchBucket':
                self.__raise_no_bucket(exc)
            detail = f'{code or status}: {message}' if message else f'{code or status}'
            if code in _ACCESS_CODES or status in (401, 403):
                hint = (
                    '; a missing object also reads as 403 when the credentials lack s3:ListBucket on the bucket'
                    if action in ('look up', 'download') and code in ('AccessDenied', '403')
                    else ''
                )
                raise S3AccessDeniedError(
                    f'{self.__where} refused to {action} {target} ({detail}): check access_key_id and '
                    'secret_access_key (or the credentials in the environment/profile), the region, and that '
                    f'they grant access to the bucket{hint}',
                    bucket=self.bucket,
                    endpoint=self.__where,
                ) from exc
            raise S3MediaError(
                f'could not {action} {target} at {self.__where} ({detail})', bucket=self.bucket, endpoint=self.__where
            ) from exc
        except (NoCredentialsError, PartialCredentialsError, ProfileNotFound) as exc:
            raise S3AccessDeniedError(
                f'no usable credentials to {action} {target} at {self.__where} ({type(exc).__name__}): pass '
                'access_key_id and secret_access_key, or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile',
                bucket=self.bucket,
                endpoint=self.__where,
            ) from exc
        except (BotoConnectionError, HTTPClientError, ReadTimeoutError) as exc:
            raise S3EndpointUnreachableError(
                f'cannot reach {self.__where} to {action} {target} ({type(exc).__name__}): check the endpoint URL, '
                'that the service is running, and the network',
                bucket=self.bucket,
                endpoint=self.__where,
            ) from exc
        except BotoCoreError as exc:
            raise S3MediaError(
                f'could not {action} {target} at {self.__where} ({type(exc).__name__}: {exc})',
                bucket=self.bucket,
                endpoint=self.__where,
            ) from exc


class S3MediaStore(MediaEngine):
    """Blobs in an S3-compatible bucket, one object per content address.

    The object key is `key_prefix + key_strategy(uri, context)`, by default `<prefix><sha256>.bin`.
    A blob already present is not uploaded again (a HEAD request comes first). `context.media_type`
    becomes the object's Content-Type and `context.metadata` its `x-amz-meta-*` headers, returned by
    `get_metadata`. Blobs of `multipart_threshold_bytes` or more go up as a multipart upload, which
    is aborted if any part fails.

    Addressing is path-style by default (`https://endpoint/bucket/key`), which AWS S3, Cloudflare R2
    (`region='auto'`) and MinIO all accept. Without `access_key_id`/`secret_access_key` the
    credentials come from botocore's chain (`AWS_*` environment variables, `profile`, config
    files, roles). `client_config` (a `botocore.config.Config`) is merged over the store's defaults
    to tune retries, timeouts or signing.

    Garbage collection (`media_collection`): an object's `LastModified` is when its blob was last
    put. A put of bytes already stored copies the object onto itself (`CopyObject`, keeping its
    content type and metadata), which moves `LastModified` to now; the service copies the bytes
    server-side, and an object over 5 GiB cannot be copied in one request. `list_media` pages
    with `ListObjectsV2` under `key_prefix`, listing each key that holds one sha256 digest.
    `delete_media(older_than=...)` checks `LastModified` with a HEAD request, then deletes: S3
    has no delete-if-unchanged, so a put landing between the two (milliseconds) loses its blob.
    The times are the service's clock, which collection compares with the local one.
    """

    features: ClassVar[frozenset[str]] = frozenset({PERSISTENT, MEDIA_COLLECTION})

    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        profile: str | None = None,
        key_prefix: str = '',
        key_strategy: KeyStrategy | None = None,
        public_url: PublicUrlResolver | None = None,
        multipart_threshold_bytes: int = DEFAULT_MULTIPART_THRESHOLD_BYTES,
        multipart_part_bytes: int = DEFAULT_PART_BYTES,
        multipart_concurrency: int = 4,
        addressing_style: AddressingStyle = 'path',
        client_config: Config | None = None,
    ) -> None:
        if not isinstance(bucket, str) or not bucket or '/' in bucket:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'bucket {bucket!r} is not a bucket name: pass the bare name, e.g. "my-media"')
        if endpoint is not None:
            parts = urlsplit(endpoint)
            if parts.scheme not in ('http', 'https') or not parts.netloc:
                raise ValueError(
                    f'endpoint {endpoint!r} is not an http(s) URL: pass e.g. "https://<account>.r2.cloudflarestorage.com"'
                )
        if (access_key_id is None) != (secret_access_key is None):
            given = 'access_key_id' if access_key_id is not None else 'secret_access_key'
            raise ValueError(
                f'only {given} was passed: pass both access_key_id and secret_access_key, or neither to use the '
                'AWS credential chain (environment variables, profiles, roles)'
            )
        if session_token is not None and access_key_id is None:
            raise ValueError('session_token was passed without access_key_id and secret_access_key: pass all three')
        if not isinstance(multipart_threshold_bytes, int) or multipart_threshold_bytes < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'multipart_threshold_bytes must be a positive int, got {multipart_threshold_bytes!r}')
        if not isinstance(multipart_part_bytes, int) or not MIN_PART_BYTES <= multipart_part_bytes <= MAX_PART_BYTES:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                f'multipart_part_bytes must be between {MIN_PART_BYTES} (5 MiB) and {MAX_PART_BYTES} (5 GiB), '
                f'the part sizes S3 accepts; got {multipart_part_bytes!r}'
            )
        if not isinstance(multipart_concurrency, int) or multipart_concurrency < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f'multipart_concurrency must be a positive int, got {multipart_concurrency!r}')
        if addressing_style not in ('path', 'virtual', 'auto'):
            raise ValueError(f"addressing_style must be 'path', 'virtual' or 'auto', got {addressing_style!r}")

        self.bucket = bucket
        self.endpoint = endpoint
        self.region = region if region is not None else ('us-east-1' if endpoint is not None else None)
        self.key_prefix = key_prefix
        self.multipart_threshold_bytes = multipart_threshold_bytes
        self.multipart_part_bytes = multipart_part_bytes
        self.multipart_concurrency = multipart_concurrency
        config = Config(
            s3={'addressing_style': addressing_style},
            signature_version='s3v4',
            retries={'mode': 'standard', 'max_attempts': 3},
            connect_timeout=10,
            read_timeout=60,
            # Checksums only where S3 requires them: many S3-compatible services reject the newer
            # default trailing checksums. Content addressing already guards every read (see `get`).
            request_checksum_calculation='when_required',
            response_checksum_validation='when_required',
        )
        if client_config is not None:
            config = config.merge(client_config)  # pyright: ignore[reportUnknownMemberType]
        self.__blobs = _S3Blobs(
            bucket=bucket,
            endpoint=endpoint,
            region=self.region,
            key_prefix=key_prefix,
            key_strategy=key_strategy or default_key,
            multipart_threshold_bytes=multipart_threshold_bytes,
            multipart_part_bytes=multipart_part_bytes,
            multipart_concurrency=multipart_concurrency,
            credentials=_Credentials(access_key_id, secret_access_key, session_token, profile),
            config=config,
        )
        super().__init__(self.__blobs, public_url=public_url)

    def __repr__(self) -> str:
        return self.__blobs.describe()

    async def client(self) -> S3Client:
        """The store's aiobotocore S3 client, opened on first use (e.g. for `generate_presigned_url`)."""
        return await self.__blobs.client()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def key_for(self, uri: str, context: MediaContext = EMPTY_CONTEXT) -> str:
        """The object key of `uri`: `key_prefix` plus the key strategy's result."""
        return self.__blobs.key_for(uri, context)
