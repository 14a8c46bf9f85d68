"""DiskMediaStore behaviour beyond the shared suite: layout, dedup, sidecars, key strategies."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from media_disk import DiskMediaStore
from stepcore import media_from_spec
from stepcore.media import MediaContext, digest_of_uri, media_uri


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob('*') if p.is_file())


async def test_blob_is_stored_once_at_its_digest(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path / 'media')
    data = b'\x89PNG fake image bytes'
    uri = await store.put(data, context=MediaContext(media_type='image/png'))
    assert uri == media_uri(data)
    blob = tmp_path / 'media' / f'{digest_of_uri(uri)}.bin'
    assert blob.read_bytes() == data
    first = blob.stat()

    assert await store.put(data) == uri
    again = blob.stat()
    assert again.st_ino == first.st_ino, 'a blob already present is not rewritten'
    assert again.st_mtime_ns >= first.st_mtime_ns, 'a put of stored bytes counts as a put now (garbage collection)'
    assert _files(tmp_path / 'media') == [blob.name], 'no temporary files or sidecars are left behind'
    assert await store.get(uri) == data
    assert await store.exists(uri)


async def test_sidecar_written_only_with_metadata(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    plain = await store.put(b'no metadata')
    assert await store.get_metadata(plain) is None
    assert not (tmp_path / f'{digest_of_uri(plain)}.bin.meta.json').exists()

    tagged = await store.put(
        b'with metadata', context=MediaContext(media_type='text/plain', metadata={'source': 'upload', 'lang': 'é'})
    )
    sidecar = tmp_path / f'{digest_of_uri(tagged)}.bin.meta.json'
    assert json.loads(sidecar.read_text()) == {
        'format': 1,
        'metadata': {'source': 'upload', 'lang': 'é'},
        'media_type': 'text/plain',
    }
    assert await store.get_metadata(tagged) == {'source': 'upload', 'lang': 'é'}

    # A later put without metadata leaves the stored metadata alone.
    await store.put(b'with metadata')
    assert await store.get_metadata(tagged) == {'source': 'upload', 'lang': 'é'}


async def test_sidecar_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'x', context=MediaContext(metadata={'a': 'b'}))
    sidecar = tmp_path / f'{digest_of_uri(uri)}.bin.meta.json'
    sidecar.write_text(json.dumps({'format': 7, 'metadata': {'a': 'b'}}))
    with pytest.raises(ValueError, match='format 7'):
        await store.get_metadata(uri)


async def test_malformed_uri_is_refused(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    with pytest.raises(ValueError, match='media URI'):
        await store.get('media+sha256://../../etc/passwd')
    with pytest.raises(ValueError, match='media URI'):
        await store.exists('https://example.com/x.png')


async def test_key_strategy_places_blobs_in_subfolders(tmp_path: Path) -> None:
    def by_media_type(uri: str, ctx: MediaContext) -> str:
        ext = {'image/png': '.png'}.get(ctx.media_type or '', '.bin')
        return f'images/{digest_of_uri(uri)}{ext}'

    store = DiskMediaStore(tmp_path, key_strategy=by_media_type)
    png = MediaContext(media_type='image/png', metadata={'k': 'v'})
    uri = await store.put(b'png bytes', context=png)
    digest = digest_of_uri(uri)
    assert _files(tmp_path) == [f'images/{digest}.png', f'images/{digest}.png.meta.json']
    assert await store.get(uri, context=png) == b'png bytes'
    # The strategy depends on the context: without it the blob is looked for elsewhere.
    assert not await store.exists(uri)


@pytest.mark.parametrize('key', ['/etc/passwd', '../outside.bin', 'a/../../b.bin', 'a\\..\\b.bin', '', 'dir/'])
async def test_unsafe_keys_are_refused(tmp_path: Path, key: str) -> None:
    store = DiskMediaStore(tmp_path / 'media', key_strategy=lambda uri, ctx: key)
    with pytest.raises(ValueError, match='key_strategy returned'):
        await store.put(b'data')
    with pytest.raises(ValueError, match='key_strategy returned'):
        await store.get(media_uri(b'data'))
    assert not (tmp_path / 'media').exists()
    assert _files(tmp_path) == []


async def test_public_url_resolvers(tmp_path: Path) -> None:
    uri = media_uri(b'x')
    assert await DiskMediaStore(tmp_path).public_url(uri) is None

    sync_store = DiskMediaStore(tmp_path, public_url=lambda u, ctx: f'https://cdn.test/{digest_of_uri(u)}')
    assert await sync_store.public_url(uri) == f'https://cdn.test/{digest_of_uri(uri)}'

    async def presign(u: str, ctx: MediaContext) -> str | None:
        return f'https://signed.test/{digest_of_uri(u)}?type={ctx.media_type}'

    async_store = DiskMediaStore(tmp_path, public_url=presign)
    got = await async_store.public_url(uri, context=MediaContext(media_type='image/png'))
    assert got == f'https://signed.test/{digest_of_uri(uri)}?type=image/png'


async def test_built_from_spec(tmp_path: Path) -> None:
    store = media_from_spec('disk', directory=str(tmp_path / 'blobs'))
    assert isinstance(store, DiskMediaStore)
    uri = await store.put(b'spec')
    assert (tmp_path / 'blobs' / f'{digest_of_uri(uri)}.bin').read_bytes() == b'spec'


@pytest.mark.parametrize('umask', [0o022, 0o000], ids=['umask-022', 'umask-000'])
async def test_blobs_sidecars_and_folders_are_owner_only_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    previous = os.umask(umask)
    try:
        store = DiskMediaStore(
            tmp_path / 'missing' / 'media', key_strategy=lambda uri, context: f'a/b/{digest_of_uri(uri)}'
        )
        await store.put(b'nested blob', context=MediaContext(metadata={'k': 'v'}))
        plain = DiskMediaStore(tmp_path / 'missing' / 'plain')
        await plain.put(b'plain blob')
    finally:
        os.umask(previous)
    created = sorted((tmp_path / 'missing').rglob('*'))
    assert len([p for p in created if p.is_file()]) == 3  # two blobs and a sidecar
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in [tmp_path / 'missing', *created]}
    assert modes == {name: 0o700 if (tmp_path / name).is_dir() else 0o600 for name in modes}


async def test_a_damaged_sidecar_fails_get_metadata_only(tmp_path: Path) -> None:
    store = DiskMediaStore(tmp_path)
    uri = await store.put(b'blob', context=MediaContext(metadata={'k': 'v'}))
    DiskMediaStore.sidecar_path(store.path_for(uri)).write_bytes(b'{not json')
    assert await store.exists(uri)
    assert await store.get(uri) == b'blob'
    with pytest.raises(ValueError, match='is not valid JSON'):
        await store.get_metadata(uri)
