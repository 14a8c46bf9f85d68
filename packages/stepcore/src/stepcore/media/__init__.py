"""Media: content-addressed blobs that stored snapshots reference instead of holding the bytes.

- `protocol.py`: the `MediaStore` protocol, `MediaContext`, addresses and the `media_store=` option;
- `walker.py`: moving large binary content and text out of messages into a media store and back;
- `engine.py`, `port.py`, `metadata.py`, `errors.py`: the media engine every media backend is built on;
- `encrypting.py`: a media store whose blobs are encrypted in another one.
"""

from __future__ import annotations

from stepcore.media.protocol import (
    AUTO,
    EMPTY_CONTEXT,
    MEDIA_URI_PREFIX,
    CollectableMediaStore,
    KeyStrategy,
    MediaContext,
    MediaStore,
    MediaStoreOption,
    PublicUrlResolver,
    StoredMedia,
    check_media_store,
    default_key,
    digest_of_uri,
    media_uri,
    resolve_media_store,
    resolve_public_url,
    uri_of_digest,
)

__all__ = (
    'AUTO',
    'EMPTY_CONTEXT',
    'MEDIA_URI_PREFIX',
    'CollectableMediaStore',
    'KeyStrategy',
    'MediaContext',
    'MediaStore',
    'MediaStoreOption',
    'PublicUrlResolver',
    'StoredMedia',
    'check_media_store',
    'default_key',
    'digest_of_uri',
    'media_uri',
    'resolve_media_store',
    'resolve_public_url',
    'uri_of_digest',
)
