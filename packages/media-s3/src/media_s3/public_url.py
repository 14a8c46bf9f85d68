"""`public_url` resolvers for blobs served straight from a bucket, a CDN or a public bucket domain."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote, urlsplit

from stepcore.backend import (
    EMPTY_CONTEXT,
    KeyStrategy,
    MediaContext,
    default_key,
)

__all__ = ('make_static_public_url',)


def make_static_public_url(
    base_url: str,
    key_prefix: str = '',
    *,
    key_strategy: KeyStrategy | None = None,
) -> Callable[[str, MediaContext], str]:
    """A resolver mapping a `media+sha256://` URI to `<base_url>/<key_prefix><key>`.

    Use it when the bucket (or a CDN in front of it) serves objects publicly, e.g. an R2 public
    bucket domain. Pass the same `key_prefix` and `key_strategy` as the store so the URL points at
    the object the store wrote. The key is percent-encoded except for `/`.
    """
    parts = urlsplit(base_url)
    if parts.scheme not in ('http', 'https') or not parts.netloc:
        raise ValueError(f'base_url {base_url!r} is not an http(s) URL: pass e.g. "https://media.example.com"')
    if parts.query or parts.fragment:
        raise ValueError(f'base_url {base_url!r} carries a query or fragment: pass only scheme, host and path')
    base = base_url.rstrip('/')
    strategy = key_strategy or default_key

    def resolve(uri: str, context: MediaContext = EMPTY_CONTEXT) -> str:
        return f'{base}/{quote(key_prefix + strategy(uri, context), safe="/")}'

    return resolve
