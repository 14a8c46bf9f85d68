"""`RedisMediaStore`: content-addressed blobs as Redis strings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import ClassVar, Final, cast

from redis.asyncio import Redis

from stepcore.backend import (
    MEDIA_COLLECTION,
    PERSISTENT,
    BlobHead,
    BlobMeta,
    BlobPort,
    BlobRef,
    ListedBlob,
    MediaEngine,
    PublicUrlResolver,
    from_micros,
    micros,
)

from .client import ClientUser
from .keys import DEFAULT_KEY_PREFIX, Keys

__all__ = ('RedisMediaStore',)

DELETE_MEDIA: Final = """
-- KEYS: the blob, its metadata, the put times. ARGV: digest, cutoff in microseconds ('' for none).
-- Answers 1 when the blob was removed, 0 when it is missing or was put at or after the cutoff.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[2] ~= '' then
  local stored = redis.call('ZSCORE', KEYS[3], ARGV[1])
  if stored and tonumber(stored) >= tonumber(ARGV[2]) then return 0 end
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""
_SCAN_COUNT = 1000


class _RedisBlobs(BlobPort):
    """The blob port of `RedisMediaStore`: one string per blob, and the sorted set of put times."""

    def __init__(self, client: Redis, keys: Keys) -> None:
        self.__client = client
        self.__keys = keys
        self.__delete_media = client.register_script(DELETE_MEDIA)

    def where(self) -> str:
        return f'Redis key {self.__keys.media("<sha256>").decode()!r}'

    async def put(self, ref: BlobRef, data: bytes, meta: BlobMeta, stored_us: int) -> None:
        pipe = self.__client.pipeline(transaction=True)
        pipe.set(self.__keys.media(ref.digest), data, nx=True)
        if meta.text is not None:
            pipe.set(self.__keys.media_meta(ref.digest), meta.text, nx=True)
        pipe.zadd(self.__keys.media_times, {ref.digest: stored_us})
        await pipe.execute()

    async def get(self, ref: BlobRef) -> bytes | None:
        return cast(bytes | None, await self.__client.get(self.__keys.media(ref.digest)))

    async def head(self, ref: BlobRef) -> BlobHead | None:
        pipe = self.__client.pipeline(transaction=False)
        pipe.exists(self.__keys.media(ref.digest))
        pipe.get(self.__keys.media_meta(ref.digest))
        found, metadata = await pipe.execute()
        return BlobHead(metadata=cast(bytes | None, metadata)) if found else None

    async def list(self) -> AsyncIterator[ListedBlob]:
        start = len(self.__keys.media(''))
        cursor: int = 0
        while True:
            cursor, found = await self.__client.scan(cursor=cursor, match=self.__keys.media('*'), count=_SCAN_COUNT)
            keys = [cast(bytes, k) for k in found]
            if keys:
                pipe = self.__client.pipeline(transaction=False)
                for key in keys:
                    pipe.zscore(self.__keys.media_times, key[start:])
                    pipe.strlen(key)
                replies = list(await pipe.execute())
                for n, key in enumerate(keys):
                    stored, size = replies[2 * n], replies[2 * n + 1]
                    if not size and stored is None:
                        continue  # removed since the scan saw it
                    digest = key[start:].decode()
                    yield ListedBlob(digest=digest, stored_at=from_micros(stored), size=int(size))
            if cursor == 0:
                return

    async def delete(self, ref: BlobRef, location: object, older_than: datetime | None) -> bool:
        cutoff = '' if older_than is None else str(micros(older_than))
        keys = [self.__keys.media(ref.digest), self.__keys.media_meta(ref.digest), self.__keys.media_times]
        return bool(await self.__delete_media(keys=keys, args=[ref.digest, cutoff]))


class RedisMediaStore(ClientUser, MediaEngine):
    """Blobs in Redis, one string per sha256 digest (`<key_prefix>:media:<digest>`).

    Pass a Redis URL as `url=` (the store owns that client: `await store.aclose()`) or a shared
    `redis.asyncio.Redis` as `client=` (never closed by the store). A blob already stored is not
    written again, and its first metadata is kept, so concurrent writers of one blob never conflict.
    A blob is held whole in the server's memory and in the caller's on put and get, and a Redis
    string holds at most 512 MB (the server's `proto-max-bulk-len`): this store suits small media.
    For large files use a disk or S3 media store with `RedisStepStore(media_store=...)`.

    Garbage collection (`media_collection`): the sorted set `<key_prefix>:mediatime` scores each
    digest with when it was last put (every put sets it, in the same transaction as the blob);
    `list_media` walks the blob keys with `SCAN`, and `delete_media` checks the time and removes
    the blob in one Lua script. A blob stored before this set existed counts as put long ago.
    """

    features: ClassVar[frozenset[str]] = frozenset({PERSISTENT, MEDIA_COLLECTION})

    def __init__(
        self,
        *,
        url: str | None = None,
        client: Redis | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        public_url: PublicUrlResolver | None = None,
    ) -> None:
        self.keys = Keys(key_prefix)
        self.key_prefix = key_prefix
        ClientUser.__init__(self, 'RedisMediaStore', client, url)
        MediaEngine.__init__(self, _RedisBlobs(self.client, self.keys), public_url=public_url)
