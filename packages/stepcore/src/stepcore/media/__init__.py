"""Media: content-addressed blobs that stored snapshots reference instead of holding the bytes.

- `protocol.py`: the `MediaStore` protocol, `MediaContext`, addresses and the `media_store=` option;
- `walker.py`: moving large binary content and text out of messages into a media store and back;
- `blob_engine.py`: `MediaEngine`, the media engine every media backend is built on, which calls
  a blob port (`blob_port.py`: `BlobPort`, the I/O a backend implements, and the values it deals in);
- `metadata.py`: how a blob's metadata is checked and stored;
- `errors.py`: `MediaNotFoundError` (no blob at that address) and `DamagedMediaError` (stored bytes
  that are not the blob's);
- `encrypting.py`: a media store whose blobs are encrypted in another one.
"""

from __future__ import annotations

from stepcore.media.blob_engine import MediaEngine
from stepcore.media.blob_port import (
    BlobHead,
    BlobPort,
    BlobRef,
    ListedBlob,
    digest_in_name,
    from_micros,
    micros,
    now_micros,
    strategy_key,
)
from stepcore.media.errors import DamagedMediaError, MediaNotFoundError
from stepcore.media.metadata import BlobMeta, decode_metadata, encode_metadata
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
    'BlobHead',
    'BlobMeta',
    'BlobPort',
    'BlobRef',
    'CollectableMediaStore',
    'DamagedMediaError',
    'KeyStrategy',
    'ListedBlob',
    'MediaContext',
    'MediaEngine',
    'MediaNotFoundError',
    'MediaStore',
    'MediaStoreOption',
    'PublicUrlResolver',
    'StoredMedia',
    'check_media_store',
    'decode_metadata',
    'default_key',
    'digest_in_name',
    'digest_of_uri',
    'encode_metadata',
    'from_micros',
    'media_uri',
    'micros',
    'now_micros',
    'resolve_media_store',
    'resolve_public_url',
    'strategy_key',
    'uri_of_digest',
)
