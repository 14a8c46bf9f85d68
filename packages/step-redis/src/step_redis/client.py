"""Choosing the `redis.asyncio.Redis` client a store works on, and who closes it."""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis

__all__ = ('ClientUser', 'open_client')

SCHEMES = ('redis://', 'rediss://', 'unix://')


def open_client(owner: str, client: Redis | None, url: str | None) -> tuple[Redis, bool]:
    """The client to use and whether the store owns it (created it from `url`)."""
    if client is not None and url is not None:
        raise ValueError(f'{owner} takes client= or url=, not both: pass a shared client or a Redis URL')
    if client is not None:
        if not isinstance(cast(object, client), Redis):
            raise TypeError(
                f'{owner} needs a redis.asyncio.Redis as client=, got {type(client).__name__}: create one with '
                'redis.asyncio.Redis.from_url(url) or pass url= instead'
            )
        if cast(Any, client).get_encoder().decode_responses:
            raise ValueError(
                f'{owner} needs a client that answers bytes: create it without decode_responses=True '
                '(the store decodes what it reads itself)'
            )
        return client, False
    if url is None:
        raise ValueError(
            f"{owner} needs url= (a Redis URL such as 'redis://127.0.0.1:6379/0') or client= "
            '(a shared redis.asyncio.Redis)'
        )
    if not isinstance(cast(object, url), str) or not url.strip().lower().startswith(SCHEMES):
        raise ValueError(
            f"{owner} got url={url!r}: expected a 'redis://', 'rediss://' or 'unix://' URL, "
            "e.g. 'redis://127.0.0.1:6379/0'"
        )
    return Redis.from_url(url.strip(), decode_responses=False), True  # pyright: ignore[reportUnknownMemberType]


class ClientUser:
    """The client a store works on; `aclose()` closes it only when the store created it from `url=`.

    `RedisStepStore` and its default `RedisMediaStore` share one client.
    """

    def __init__(self, owner: str, client: Redis | None, url: str | None) -> None:
        self.__client, self.__owns_client = open_client(owner, client, url)

    @property
    def client(self) -> Redis:
        """The `redis.asyncio.Redis` client this store uses."""
        return self.__client

    async def aclose(self) -> None:
        """Close the client if this store created it from `url`; a given client stays open."""
        if self.__owns_client:
            await self.__client.aclose()
