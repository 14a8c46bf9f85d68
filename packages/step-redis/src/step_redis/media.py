"""`RedisMediaStore`: content-addressed blobs as Redis strings."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import ClassVar, cast

from redis.asyncio import Redis

from stepcore.features import PERSISTENT
from stepcore.media import EMPTY_CONTEXT, MediaContext, PublicUrlResolver, digest_of_uri, media_uri, resolve_public_url

from .client import ClientUser
from .keys import DEFAULT_KEY_PREFIX, Keys

__all__ = ('RedisMediaStore',)


class RedisMediaStore(ClientUser):
    """Blobs in Redis, one string per sha256 digest (`<key_prefix>:media:<digest>`).

    Pass a Redis URL as `url=` (the store owns that client: `await store.aclose()`) or a shared
    `redis.asyncio.Redis` as `client=` (never closed by the store). A blob already stored is not
    written again, and its first metadata is kept, so concurrent writers of one blob never conflict.
    A blob is held whole in the server's memory and in the caller's on put and get, and a Redis
    string holds at most 512 MB (the server's `proto-max-bulk-len`): this store suits small media.
    For large files use a disk or S3 media store with `RedisStepStore(media_store=...)`.
    """

    features: ClassVar[frozenset[str]] = frozenset({PERSISTENT})

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

    async def put(self, data: bytes, *, context: MediaContext = EMPTY_CONTEXT) -> str:
        uri = media_uri(data)
        digest = digest_of_uri(uri)
        pipe = self._client.pipeline(transaction=True)
        pipe.set(self.keys.media(digest), bytes(data), nx=True)
        if context.metadata:
            pipe.set(self.keys.media_meta(digest), json.dumps(dict(context.metadata), ensure_ascii=False), nx=True)
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
