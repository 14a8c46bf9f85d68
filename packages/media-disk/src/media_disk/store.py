"""`DiskMediaStore`: content-addressed blobs as files in one directory."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, cast

import anyio.to_thread

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
    make_dir,
    remove_file,
    replace_file,
    strategy_key,
    using_full_fsync,
    write_atomic,
)

__all__ = ('SIDECAR_SUFFIX', 'DiskMediaStore')

SIDECAR_SUFFIX = '.meta.json'
"""Appended to a blob's path to name the JSON file holding its metadata."""
_SIDECAR_FORMAT = 1
_LIST_BATCH = 256
logger = logging.getLogger(__name__)


def _sidecar_path(blob_path: Path) -> Path:
    return blob_path.with_name(blob_path.name + SIDECAR_SUFFIX)


class _DiskBlobs(BlobPort):
    """The blob port of `DiskMediaStore`: a file per blob under `directory`, metadata beside it."""

    def __init__(self, directory: Path, key_strategy: KeyStrategy, full_fsync: bool | None = None) -> None:
        self.__directory = directory
        self.__key_strategy = key_strategy
        self.__full_fsync = full_fsync

    def path_for(self, uri: str, context: MediaContext = EMPTY_CONTEXT) -> Path:
        """Where the blob for `uri` lives; `ValueError` for a malformed URI or an unsafe key."""
        key = strategy_key(self.__key_strategy, BlobRef.of(uri, context))
        segments = key.replace('\\', '/').split('/')
        if key.startswith(('/', '\\')) or os.path.isabs(key) or (len(key) > 1 and key[1] == ':'):
            raise ValueError(
                f'key_strategy returned the absolute path {key!r} for {uri!r}: return a path relative to '
                f'the media directory {str(self.__directory)!r}'
            )
        if '..' in segments:
            raise ValueError(
                f'key_strategy returned {key!r} for {uri!r}, which has a ".." segment and could leave the media '
                f'directory {str(self.__directory)!r}: return a path without ".."'
            )
        if segments[-1] in ('', '.'):
            raise ValueError(f'key_strategy returned {key!r} for {uri!r}: it must name a file, not a directory')
        return self.__directory.joinpath(*(s for s in segments if s not in ('', '.')))

    def where(self) -> str:
        return f'media directory {str(self.__directory)!r}'

    async def put(self, ref: BlobRef, data: bytes, meta: BlobMeta, stored_us: int) -> None:
        path = self.path_for(ref.uri, ref.context)
        sidecar: bytes | None = None
        if meta.metadata:
            sidecar = json.dumps(
                {'format': _SIDECAR_FORMAT, 'metadata': dict(meta.metadata), 'media_type': meta.media_type},
                ensure_ascii=False,
                separators=(',', ':'),
            ).encode()
        await anyio.to_thread.run_sync(self.__put_sync, path, data, sidecar)

    def __put_sync(self, path: Path, data: bytes, sidecar: bytes | None) -> None:
        with using_full_fsync(self.__full_fsync):
            self.__write(path, data, sidecar)

    def __write(self, path: Path, data: bytes, sidecar: bytes | None) -> None:
        # The time of the put, from the clock collection compares with (a file system stamps new
        # files from a coarser one, a few milliseconds behind).
        now = time.time_ns()
        try:
            os.utime(path, ns=(now, now))  # already stored: it counts as put now (see `list_media`)
            stored = path.is_file()
        except FileNotFoundError:
            stored = False
        if not stored:
            make_dir(path.parent)
            write_atomic(path, data)
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile: a later put writes it again
                os.utime(path, ns=(now, now))
        if sidecar is not None:
            side = _sidecar_path(path)
            try:
                current = side.read_bytes()
            except FileNotFoundError:
                current = None
            if current != sidecar:
                write_atomic(side, sidecar)

    async def get(self, ref: BlobRef) -> bytes | None:
        path = self.path_for(ref.uri, ref.context)
        try:
            return await anyio.to_thread.run_sync(path.read_bytes)
        except FileNotFoundError:
            return None

    async def exists(self, ref: BlobRef) -> bool:
        return await anyio.to_thread.run_sync(self.path_for(ref.uri, ref.context).is_file)

    async def head(self, ref: BlobRef) -> BlobHead | None:
        return await anyio.to_thread.run_sync(self.__head_sync, self.path_for(ref.uri, ref.context))

    def __head_sync(self, path: Path) -> BlobHead | None:
        if not path.is_file():
            return None
        side = _sidecar_path(path)
        try:
            raw = side.read_bytes()
        except FileNotFoundError:
            return BlobHead()
        try:
            value: Any = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f'media metadata file {str(side)!r} is not valid JSON ({exc}): delete or fix it') from None
        if not isinstance(value, dict):
            raise ValueError(f'media metadata file {str(side)!r} does not hold a JSON object: delete or fix it')
        content = cast(dict[str, Any], value)
        version = content.get('format')
        if version != _SIDECAR_FORMAT:
            raise ValueError(
                f'media metadata file {str(side)!r} has format {version!r}, which this media-disk does not read '
                f'(it reads format {_SIDECAR_FORMAT}): upgrade media-disk'
            )
        metadata = content.get('metadata')
        if not isinstance(metadata, dict):
            raise ValueError(f'media metadata file {str(side)!r} has no "metadata" object: delete or fix it')
        return BlobHead(metadata=cast(dict[str, Any], metadata))

    async def list(self) -> AsyncIterator[ListedBlob]:
        walk = self.__walk()
        done = object()
        while True:
            batch = await anyio.to_thread.run_sync(lambda: [next(walk, done) for _ in range(_LIST_BATCH)])
            for item in batch:
                if item is done:
                    return
                assert isinstance(item, ListedBlob)
                yield item

    def __walk(self) -> Iterator[ListedBlob]:
        unnamed = 0
        stack = [self.__directory]
        while stack:
            folder = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.name.startswith('.') or entry.name.endswith(SIDECAR_SUFFIX):
                    continue  # temporary files, blobs being removed, metadata
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                    continue
                digest = digest_in_name(entry.name)
                if digest is None:
                    unnamed += 1
                    continue
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                yield ListedBlob(
                    digest=digest,
                    stored_at=datetime.fromtimestamp(stat.st_mtime, UTC),
                    size=stat.st_size,
                    location=Path(entry.path),
                )
        if unnamed:
            logger.warning(
                '%d file(s) under %s do not name one sha256 digest, so they are never collected: '
                'use a key_strategy whose file names hold the digest',
                unnamed,
                self.__directory,
            )

    async def delete(self, ref: BlobRef, location: object, older_than: datetime | None) -> bool:
        path = location if isinstance(location, Path) else self.path_for(ref.uri)
        return await anyio.to_thread.run_sync(self.__delete_sync, path, older_than)

    def __delete_sync(self, path: Path, older_than: datetime | None) -> bool:
        # Each rename and removal waits a little on Windows for a reader (a `get` in another process,
        # say) to close the file: there it cannot be renamed or removed while open.
        aside = path.with_name(f'.{path.name}.{uuid.uuid4().hex}.removing')
        try:
            replace_file(path, aside)
        except FileNotFoundError:
            return False
        # From here a `put` finds no file and writes it anew; one that touched it before is seen now.
        if older_than is not None and datetime.fromtimestamp(aside.stat().st_mtime, UTC) >= older_than:
            replace_file(aside, path)  # put again meanwhile: back it goes (a new copy holds the same bytes)
            return False
        remove_file(aside)
        if not path.exists():
            remove_file(_sidecar_path(path), missing_ok=True)
        return True


class DiskMediaStore(MediaEngine):
    """Stores each blob once, as a file under `directory` (by default `<sha256>.bin`).

    - Writes are atomic: a temporary file in the same directory is fsynced and renamed into
      place, so a reader never sees a partial blob. A blob already present is not rewritten.
    - Files are created `0600` and folders `0700` (owner only), whatever the umask.
    - `key_strategy(uri, context)` may choose another relative path; an absolute path or one with
      a `..` segment is refused with `ValueError`.
    - When a `put` carries `context.metadata`, the mapping (and `context.media_type`) is written
      to a sidecar `<blob path>.meta.json`, also atomically. Without metadata no sidecar is
      written and `get_metadata` returns `None`.
    - `public_url` (sync or async) turns a URI into a fetchable URL; without it `public_url`
      returns `None`.
    - Garbage collection (`media_collection`): a blob's modification time is when it was last
      put (a `put` of bytes already stored touches the file). `list_media` walks the directory
      with `os.scandir` and lists each file whose name holds its sha256 digest (every file of the
      default key strategy); `delete_media` renames the file aside before it looks at its time,
      so a `put` racing with it either touched it first (and it is put back) or writes it anew.

    - Durability: every blob and sidecar is fsynced before it is renamed into place; on macOS
      with `F_FULLFSYNC`, which also empties the drive's cache, unless `full_fsync=False` selects
      the plain, faster `fsync` (the newest blobs may then be lost in a power loss). `None` is the
      platform's default; elsewhere the option changes nothing.
    - On Windows a blob another process is reading cannot be renamed or removed: collection waits
      a little for it, then fails with a `PermissionError` naming the file.

    File I/O runs in worker threads, never on the event loop.
    """

    features: ClassVar[frozenset[str]] = frozenset({PERSISTENT, MEDIA_COLLECTION})

    def __init__(
        self,
        directory: str | os.PathLike[str],
        key_strategy: KeyStrategy | None = None,
        public_url: PublicUrlResolver | None = None,
        *,
        full_fsync: bool | None = None,
    ) -> None:
        if full_fsync is not None and not isinstance(cast(object, full_fsync), bool):
            raise ValueError(f'full_fsync={full_fsync!r} must be True, False or None (the platform default)')
        self.directory = Path(directory)
        self.key_strategy: KeyStrategy = key_strategy if key_strategy is not None else default_key
        self.full_fsync = full_fsync
        self.__blobs = _DiskBlobs(self.directory, self.key_strategy, full_fsync)
        super().__init__(self.__blobs, public_url=public_url)

    def __repr__(self) -> str:
        return f'{type(self).__name__}({str(self.directory)!r})'

    # -- paths ------------------------------------------------------------------------------

    def path_for(self, uri: str, context: MediaContext = EMPTY_CONTEXT) -> Path:
        """Where the blob for `uri` lives; `ValueError` for a malformed URI or an unsafe key."""
        return self.__blobs.path_for(uri, context)

    @staticmethod
    def sidecar_path(blob_path: Path) -> Path:
        """The metadata sidecar of a blob."""
        return _sidecar_path(blob_path)
