"""`RedisMediaStore`: content-addressed blobs as Redis strings."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import ClassVar, Final, cast

from redis.asyncio import Redis

from stepcore.features import MEDIA_COLLECTION, PERSISTENT
from stepcore.media import (
    EMPTY_CONTEXT,
    MediaContext,
    PublicUrlResolver,
    StoredMedia,
    digest_of_uri,
    media_uri,
    resolve_public_url,
    uri_of_digest,
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


class RedisMediaStore(ClientUser):
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
        self._use_client('RedisMediaStore', client, url)
        self.public_url_resolver = public_url
        self._delete_media = self._client.register_script(DELETE_MEDIA)

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        uri = media_uri(data)
        digest = digest_of_uri(uri)
        pipe = self._client.pipeline(transaction=True)
        pipe.set(self.keys.media(digest), bytes(data), nx=True)
        if context.metadata:
            pipe.set(self.keys.media_meta(digest), json.dumps(dict(context.metadata), ensure_ascii=False), nx=True)
        pipe.zadd(self.keys.media_times, {digest: time.time_ns() // 1000})
        await pipe.execute()
        return uri

    async def get(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bytes:
        digest = digest_of_uri(uri)
        key = self.keys.media(digest)
        data = cast(bytes | None, await self._client.get(key))
        if data is None:
            raise LookupError(f'no blob stored at {uri} in Redis key {key.decode()!r}')
        if hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(
                f'blob {uri} in Redis key {key.decode()!r} is damaged: its {len(data)} bytes do not match the digest; '
                'put the original bytes again after deleting the key to repair it'
            )
        return data

    async def exists(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> bool:
        return bool(await self._client.exists(self.keys.media(digest_of_uri(uri))))

    async def public_url(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> str | None:
        digest_of_uri(uri)
        return await resolve_public_url(self.public_url_resolver, uri, context)

    async def get_metadata(self, uri: str, *, context: MediaContext = EMPTY_CONTEXT) -> Mapping[str, str] | None:
        found = cast(bytes | None, await self._client.get(self.keys.media_meta(digest_of_uri(uri))))
        return cast(dict[str, str], json.loads(found)) if found is not None else None

    async def list_media(self) -> AsyncIterator[StoredMedia]:
        """Every blob under the prefix (found with `SCAN`), with when it was last put."""
        start = len(self.keys.media(''))
        cursor: int = 0
        while True:
            cursor, found = await self._client.scan(cursor=cursor, match=self.keys.media('*'), count=_SCAN_COUNT)
            keys = [cast(bytes, k) for k in found]
            if keys:
                pipe = self._client.pipeline(transaction=False)
                for key in keys:
                    pipe.zscore(self.keys.media_times, key[start:])
                    pipe.strlen(key)
                replies = list(await pipe.execute())
                for n, key in enumerate(keys):
                    stored, size = replies[2 * n], replies[2 * n + 1]
                    if not size and stored is None:
                        continue  # removed since the scan saw it
                    micros = int(stored) if stored is not None else 0
                    yield StoredMedia(
                        uri=uri_of_digest(key[start:].decode()),
                        stored_at=datetime.fromtimestamp(micros / 1_000_000, UTC),
                        size=int(size),
                    )
            if cursor == 0:
                return

    async def delete_media(self, uri: str, *, older_than: datetime | None = None) -> bool:
        """Remove the blob and its metadata; with `older_than`, only while it was last put before then."""
        digest = digest_of_uri(uri)
        cutoff = '' if older_than is None else str(int(older_than.timestamp() * 1_000_000))
        keys = [self.keys.media(digest), self.keys.media_meta(digest), self.keys.media_times]
        return bool(await self._delete_media(keys=keys, args=[digest, cutoff]))
