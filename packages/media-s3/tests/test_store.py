"""S3MediaStore against a real S3-compatible server over loopback (SeaweedFS by default)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.config import Config

from media_s3 import (
    S3AccessDeniedError,
    S3BucketNotFoundError,
    S3EndpointUnreachableError,
    S3MediaStore,
    make_static_public_url,
)
from stepcore.media import MediaContext, MediaStore, media_uri

from .conftest import S3Server

MiB = 1024 * 1024


class Calls:
    """Counts the S3 operations a client sends, from botocore's own `before-call` event."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, model: Any, **_: Any) -> None:
        self.counts[model.name] += 1


async def count_calls(store: S3MediaStore) -> Calls:
    calls = Calls()
    (await store.client()).meta.events.register('before-call.s3', calls)
    return calls


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def blob(size: int, seed: bytes = b'') -> bytes:
    """Incompressible-looking bytes of `size`, different per seed."""
    block = hashlib.sha256(seed).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


async def test_round_trip_and_content_type(s3_store: S3MediaStore) -> None:
    data = b'\x89PNG\r\n\x1a\n' + b'\x00\xff' * 500
    uri = media_uri(data)
    assert isinstance(s3_store, MediaStore)
    assert not await s3_store.exists(uri)

    assert await s3_store.put(data, context=MediaContext(media_type='image/png')) == uri
    assert await s3_store.exists(uri)
    assert await s3_store.get(uri) == data
    assert await s3_store.get_metadata(uri) is None

    key = s3_store.key_prefix + uri.removeprefix('media+sha256://') + '.bin'
    head = await (await s3_store.client()).head_object(Bucket=s3_store.bucket, Key=key)
    assert head['ContentType'] == 'image/png'
    assert head['ContentLength'] == len(data)


async def test_metadata_round_trips_through_headers(s3_store: S3MediaStore) -> None:
    metadata = {
        'source': 'camera-7',
        'caption': 'café — ☕ ok',
        'padded': '  spaces around  ',
        'looks-encoded': '=?UTF-8?B?eA==?=',
        'looks-empty': '=?UTF-8?B??=',
        'empty': '',
    }
    uri = await s3_store.put(b'tagged', context=MediaContext(media_type='text/plain', metadata=metadata))
    assert await s3_store.get_metadata(uri) == metadata


async def test_empty_metadata_value_is_never_sent_as_an_empty_header(s3_store: S3MediaStore) -> None:
    # S3 promises nothing for a header without a value, and compatible services drop it: the empty
    # value travels as the empty encoded word, so the name survives every service.
    uri = await s3_store.put(b'blank', context=MediaContext(metadata={'note': '', 'other': 'x'}))
    head = await (await s3_store.client()).head_object(Bucket=s3_store.bucket, Key=s3_store.key_for(uri))
    assert head['Metadata'] == {'note': '=?UTF-8?B??=', 'other': 'x'}
    assert await s3_store.get_metadata(uri) == {'note': '', 'other': 'x'}
    only_empty = await s3_store.put(b'only blank', context=MediaContext(metadata={'note': ''}))
    assert await s3_store.get_metadata(only_empty) == {'note': ''}


@pytest.mark.parametrize('name', ['Source', 'snake_case', 'dotted.name', 'héllo', '', '-lead', 'trail-', 'a b'])
async def test_bad_metadata_name_refused_before_any_request(s3_store: S3MediaStore, name: str) -> None:
    calls = await count_calls(s3_store)
    with pytest.raises(ValueError, match='S3 metadata name') as raised:
        await s3_store.put(b'x', context=MediaContext(metadata={name: 'v'}))
    assert repr(name) in str(raised.value)
    assert calls.counts == Counter()


async def test_uppercase_metadata_name_error_suggests_lowercase(s3_store: S3MediaStore) -> None:
    with pytest.raises(ValueError, match="pass 'content-origin'"):
        await s3_store.put(b'x', context=MediaContext(metadata={'Content-Origin': 'v'}))


async def test_oversized_metadata_refused(s3_store: S3MediaStore) -> None:
    calls = await count_calls(s3_store)
    with pytest.raises(ValueError, match='2048-byte limit'):
        await s3_store.put(b'x', context=MediaContext(metadata={'big': 'v' * 3000}))
    assert calls.counts == Counter()


async def test_second_put_of_same_bytes_does_not_upload(s3_store: S3MediaStore) -> None:
    calls = await count_calls(s3_store)
    data = blob(10_000, b'dedup')
    first = await s3_store.put(data, context=MediaContext(media_type='application/octet-stream'))
    assert calls.counts['PutObject'] == 1
    second = await s3_store.put(data, context=MediaContext(media_type='application/octet-stream'))
    assert second == first
    assert calls.counts['PutObject'] == 1
    assert calls.counts['HeadObject'] == 2
    assert await s3_store.get(first) == data


async def test_large_blob_uploads_multipart(s3_server: S3Server) -> None:
    data = blob(5 * MiB + 300_000, b'multipart')
    async with s3_server.store(multipart_threshold_bytes=1 * MiB, multipart_part_bytes=5 * MiB) as store:
        calls = await count_calls(store)
        context = MediaContext(media_type='video/mp4', metadata={'camera': 'front'})
        uri = await store.put(data, context=context)
        assert calls.counts['CreateMultipartUpload'] == 1
        assert calls.counts['UploadPart'] == 2
        assert calls.counts['CompleteMultipartUpload'] == 1
        assert calls.counts['PutObject'] == 0
        assert await store.get(uri) == data
        assert await store.get_metadata(uri) == {'camera': 'front'}
        head = await (await store.client()).head_object(Bucket=store.bucket, Key=store.key_for(uri))
        assert head['ContentType'] == 'video/mp4'
        assert head['ContentLength'] == len(data)


async def test_blob_below_threshold_uses_single_put(s3_server: S3Server) -> None:
    async with s3_server.store(multipart_threshold_bytes=1 * MiB) as store:
        calls = await count_calls(store)
        data = blob(MiB - 1, b'below')
        assert await store.get(await store.put(data)) == data
        assert calls.counts['PutObject'] == 1
        assert calls.counts['CreateMultipartUpload'] == 0


async def test_failed_part_aborts_the_multipart_upload(s3_server: S3Server) -> None:
    data = blob(5 * MiB + 10, b'abort')
    async with s3_server.store(multipart_threshold_bytes=1 * MiB, multipart_part_bytes=5 * MiB) as store:
        calls = await count_calls(store)

        def misroute_second_part(params: dict[str, Any], **_: Any) -> None:
            # The server rejects this part for real: its bucket does not exist.
            if params.get('PartNumber') == 2:
                params['Bucket'] = 'stepcore-no-such-bucket'

        (await store.client()).meta.events.register('provide-client-params.s3.UploadPart', misroute_second_part)
        with pytest.raises(S3BucketNotFoundError):
            await store.put(data)
        assert calls.counts['AbortMultipartUpload'] == 1
        assert calls.counts['CompleteMultipartUpload'] == 0
        assert not await store.exists(media_uri(data))
        # The server really dropped the upload: no parts are left behind to pay for.
        client: Any = await store.client()
        pending = await client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.key_prefix)
        assert pending.get('Uploads', []) == []


async def test_missing_bucket_is_named(s3_server: S3Server) -> None:
    async with s3_server.store(bucket='stepcore-absent-bucket') as store:
        attempts = (lambda: store.put(b'x'), lambda: store.get(media_uri(b'x')), lambda: store.exists(media_uri(b'x')))
        for attempt in attempts:
            with pytest.raises(S3BucketNotFoundError, match="bucket 'stepcore-absent-bucket' does not exist") as raised:
                await attempt()
            assert s3_server.endpoint in str(raised.value)
            assert raised.value.bucket == 'stepcore-absent-bucket'


async def test_unknown_access_key_is_refused(s3_server: S3Server) -> None:
    async with s3_server.store(access_key_id='NOT-A-KEY', secret_access_key='top-secret-value') as store:
        for attempt in (lambda: store.put(b'x'), lambda: store.get(media_uri(b'x'))):
            with pytest.raises(S3AccessDeniedError, match=r'refused .*stepcore-test') as raised:
                await attempt()
            assert s3_server.endpoint in str(raised.value)
            assert 'top-secret-value' not in str(raised.value)


async def test_wrong_secret_is_refused(s3_server: S3Server) -> None:
    async with s3_server.store(secret_access_key='wrong-secret-value') as store:
        calls = await count_calls(store)
        with pytest.raises(S3AccessDeniedError, match=r'refused to upload .*SignatureDoesNotMatch') as raised:
            await store.put(b'signed badly')
        assert 'wrong-secret-value' not in str(raised.value)
        assert s3_server.endpoint in str(raised.value)
        # The HEAD before the upload was refused too (a bare 403), then the upload named the cause.
        assert calls.counts['HeadObject'] == 1
        assert calls.counts['PutObject'] == 1
        with pytest.raises(S3AccessDeniedError, match=r'refused to look up .*\(403.*s3:ListBucket'):
            await store.exists(media_uri(b'signed badly'))
        with pytest.raises(S3AccessDeniedError, match=r'refused to download .*SignatureDoesNotMatch') as raised:
            await store.get(media_uri(b'signed badly'))
        assert 'wrong-secret-value' not in str(raised.value)


async def test_unreachable_endpoint_is_named() -> None:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    endpoint = f'http://127.0.0.1:{port}'
    store = S3MediaStore(
        bucket='stepcore-test',
        endpoint=endpoint,
        access_key_id='stepcore-test',
        secret_access_key='stepcore-test-secret',
        client_config=Config(retries={'mode': 'standard', 'max_attempts': 1}, connect_timeout=2),
    )
    async with store:
        with pytest.raises(S3EndpointUnreachableError, match=f'cannot reach {endpoint}') as raised:
            await store.put(b'nowhere')
    assert isinstance(raised.value, ConnectionError)
    assert raised.value.endpoint == endpoint


async def test_key_strategy_and_prefix_pick_the_object_key(s3_server: S3Server) -> None:
    def by_type(uri: str, context: MediaContext) -> str:
        ext = {'image/png': '.png'}.get(context.media_type or '', '.bin')
        return f'images/{uri.removeprefix("media+sha256://")}{ext}'

    async with s3_server.store(key_prefix='custom/', key_strategy=by_type) as store:
        png = MediaContext(media_type='image/png')
        data = blob(2000, b'strategy')
        uri = await store.put(data, context=png)
        digest = uri.removeprefix('media+sha256://')
        assert store.key_for(uri, png) == f'custom/images/{digest}.png'
        head = await (await store.client()).head_object(Bucket=store.bucket, Key=f'custom/images/{digest}.png')
        assert head['ContentLength'] == len(data)
        assert await store.get(uri, context=png) == data
        assert not await store.exists(uri)  # without the context the strategy picks `.bin`


async def test_public_url_without_resolver_is_none(s3_store: S3MediaStore) -> None:
    assert await s3_store.public_url(media_uri(b'x')) is None
    with pytest.raises(ValueError, match='media\\+sha256'):
        await s3_store.public_url('https://example.invalid/x')


async def test_static_public_url_addresses_the_object(s3_server: S3Server) -> None:
    prefix = 'public/static/'
    resolver = make_static_public_url(f'{s3_server.endpoint}/{s3_server.bucket}/', key_prefix=prefix)
    async with s3_server.store(key_prefix=prefix, public_url=resolver) as store:
        data = blob(3000, b'static')
        uri = await store.put(data, context=MediaContext(media_type='image/jpeg'))
        url = await store.public_url(uri)
        assert url is not None
        assert url == f'{s3_server.endpoint}/{s3_server.bucket}/{prefix}{uri.removeprefix("media+sha256://")}.bin'
        # The same object URL the service signs for a GET, which returns the bytes.
        client = await store.client()
        signed = await client.generate_presigned_url(
            'get_object', Params={'Bucket': store.bucket, 'Key': store.key_for(uri)}, ExpiresIn=60
        )
        assert signed.split('?', 1)[0] == url
        assert await asyncio.to_thread(fetch, signed) == data


def test_make_static_public_url_quotes_keys_and_checks_base() -> None:
    resolver = make_static_public_url(
        'https://cdn.example.com/m', key_strategy=lambda uri, ctx: f'a b/{uri[-4:]}.{ctx.filename}'
    )
    uri = media_uri(b'q')
    assert resolver(uri, MediaContext(filename='x#y')) == f'https://cdn.example.com/m/a%20b/{uri[-4:]}.x%23y'
    with pytest.raises(ValueError, match='not an http'):
        make_static_public_url('cdn.example.com')
    with pytest.raises(ValueError, match='query or fragment'):
        make_static_public_url('https://cdn.example.com/?sig=1')


async def test_sync_and_async_resolvers(s3_server: S3Server) -> None:
    seen: list[MediaContext] = []

    def sync_resolver(uri: str, ctx: MediaContext) -> str:
        seen.append(ctx)
        return 'sync:' + uri[-6:]

    async def async_resolver(uri: str, ctx: MediaContext) -> str | None:
        await asyncio.sleep(0)
        return None if ctx.media_type is None else 'async:' + uri[-6:]

    uri = media_uri(b'resolve me')
    context = MediaContext(media_type='image/gif')
    async with s3_server.store(public_url=sync_resolver) as store:
        assert await store.public_url(uri, context=context) == 'sync:' + uri[-6:]
        assert seen == [context]
    async with s3_server.store(public_url=async_resolver) as store:
        assert await store.public_url(uri, context=context) == 'async:' + uri[-6:]
        assert await store.public_url(uri) is None


async def test_presigned_url_recipe(s3_server: S3Server) -> None:
    # The recipe from docs/backends/s3.md: a resolver that signs a GET with the store's own client.
    async def presign(uri: str, ctx: MediaContext) -> str:
        client = await store.client()
        return await client.generate_presigned_url(
            'get_object',
            Params={'Bucket': store.bucket, 'Key': store.key_for(uri, ctx)},
            ExpiresIn=300,
        )

    store = s3_server.store(key_prefix='media/', public_url=presign)
    async with store:
        data = blob(4096, b'presigned')
        uri = await store.put(data, context=MediaContext(media_type='image/webp'))
        url = await store.public_url(uri)
        assert url is not None
        assert 'X-Amz-Signature=' in url
        assert await asyncio.to_thread(fetch, url) == data


async def test_one_client_per_store_reopened_after_close(s3_server: S3Server) -> None:
    store = s3_server.store()
    first = await store.client()
    assert await store.client() is first
    uri = await store.put(b'before close')
    await store.aclose()
    await store.aclose()  # closing twice is harmless
    assert await store.get(uri) == b'before close'
    assert await store.client() is not first
    await store.aclose()


async def test_concurrent_first_use_opens_one_client(s3_server: S3Server) -> None:
    async with s3_server.store() as store:
        clients = await asyncio.gather(*(store.client() for _ in range(5)))
        assert all(client is clients[0] for client in clients)
        datas = [blob(1000 + n, bytes([n])) for n in range(6)]
        uris = await asyncio.gather(*(store.put(data) for data in datas))
        assert await asyncio.gather(*(store.get(uri) for uri in uris)) == datas


@pytest.fixture
def aws_env_credentials(monkeypatch: pytest.MonkeyPatch, s3_server: S3Server) -> None:
    monkeypatch.setenv('AWS_ACCESS_KEY_ID', s3_server.access_key)
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', s3_server.secret_key)
    monkeypatch.setenv('AWS_CONFIG_FILE', '/nonexistent/stepcore-aws-config')
    monkeypatch.setenv('AWS_SHARED_CREDENTIALS_FILE', '/nonexistent/stepcore-aws-credentials')


@pytest.mark.usefixtures('aws_env_credentials')
async def test_credentials_from_environment(s3_server: S3Server) -> None:
    async with S3MediaStore(bucket=s3_server.bucket, endpoint=s3_server.endpoint, key_prefix='env/') as store:
        uri = await store.put(b'from env credentials')
        assert await store.get(uri) == b'from env credentials'


@pytest.mark.parametrize(
    ('options', 'message'),
    [
        ({'bucket': ''}, 'not a bucket name'),
        ({'bucket': 'a/b'}, 'not a bucket name'),
        ({'bucket': 'b', 'endpoint': 'localhost:9000'}, 'not an http'),
        ({'bucket': 'b', 'access_key_id': 'AK'}, 'only access_key_id'),
        ({'bucket': 'b', 'secret_access_key': 'hidden'}, 'only secret_access_key'),
        ({'bucket': 'b', 'session_token': 'tok'}, 'session_token'),
        ({'bucket': 'b', 'multipart_threshold_bytes': 0}, 'multipart_threshold_bytes'),
        ({'bucket': 'b', 'multipart_part_bytes': MiB}, 'multipart_part_bytes'),
        ({'bucket': 'b', 'multipart_concurrency': 0}, 'multipart_concurrency'),
        ({'bucket': 'b', 'addressing_style': 'sideways'}, 'addressing_style'),
    ],
)
def test_constructor_checks_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        S3MediaStore(**options)
    assert 'hidden' not in str(raised.value)


def test_repr_hides_secrets() -> None:
    store = S3MediaStore(
        bucket='b', endpoint='http://127.0.0.1:1', access_key_id='AKIDVISIBLE', secret_access_key='s3cr3t-v4lue'
    )
    assert 's3cr3t-v4lue' not in repr(store)
    assert "bucket='b'" in repr(store)


async def test_bad_uri_is_value_error(s3_store: S3MediaStore) -> None:
    with pytest.raises(ValueError, match='media\\+sha256'):
        await s3_store.get('media+sha256://nothex')
    with pytest.raises(ValueError, match='media\\+sha256'):
        await s3_store.exists('s3://bucket/key')


async def test_built_from_spec_through_the_plugin(s3_server: S3Server) -> None:
    import stepcore

    store = stepcore.media_from_spec(
        's3',
        bucket=s3_server.bucket,
        endpoint=s3_server.endpoint,
        access_key_id=s3_server.access_key,
        secret_access_key=s3_server.secret_key,
        key_prefix='spec/',
    )
    assert isinstance(store, S3MediaStore)
    async with store:
        uri = await store.put(b'built from a spec')
        assert await store.get(uri) == b'built from a spec'


def test_store_moves_to_a_new_event_loop_after_aclose(s3_server: S3Server) -> None:
    store = s3_server.store()

    async def put_and_close(data: bytes) -> str:
        try:
            return await store.put(data)
        finally:
            await store.aclose()

    async def put_only(data: bytes) -> str:
        return await store.put(data)

    def scenario() -> None:
        # In a thread of its own, so the test runner's event loop is left alone.
        assert asyncio.run(put_and_close(b'loop one')) == media_uri(b'loop one')
        assert asyncio.run(put_and_close(b'loop two')) == media_uri(b'loop two')
        with asyncio.Runner() as runner, asyncio.Runner() as other:
            runner.run(put_only(b'loop three'))
            with pytest.raises(RuntimeError, match='another event loop'):
                other.run(put_only(b'loop four'))
            runner.run(store.aclose())
            assert other.run(put_and_close(b'loop four')) == media_uri(b'loop four')

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(scenario).result()


def test_loading_the_plugin_does_not_import_the_driver() -> None:
    code = (
        'import sys, media_s3.plugin, media_s3; '
        "assert 'aiobotocore' not in sys.modules and 'botocore' not in sys.modules, 'driver imported'; "
        'media_s3.S3MediaStore; '
        "assert 'aiobotocore' in sys.modules"
    )
    completed = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
