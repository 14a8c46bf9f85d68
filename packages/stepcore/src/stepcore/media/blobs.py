"""The media engine: the `MediaStore` contract written once, over a small blob port per backend.

- `MediaEngine` (`engine.py`): the media store a backend subclasses.
- `port.py`: what the backend implements (store, read, head, list and delete bytes) and the
  values it deals in.
- `metadata.py`: how a blob's metadata is checked and stored.
- `errors.py`: `MediaNotFoundError` (no blob at that address) and `DamagedMediaError` (stored bytes
  that are not the blob's).
"""

from __future__ import annotations

from stepcore.media.engine import MediaEngine
from stepcore.media.errors import DamagedMediaError, MediaNotFoundError
from stepcore.media.metadata import BlobMeta, decode_metadata, encode_metadata
from stepcore.media.port import (
    BlobHead,
    BlobRef,
    ListedBlob,
    digest_in_name,
    from_micros,
    micros,
    now_micros,
    strategy_key,
)

__all__ = (
    'BlobHead',
    'BlobMeta',
    'BlobRef',
    'DamagedMediaError',
    'ListedBlob',
    'MediaEngine',
    'MediaNotFoundError',
    'decode_metadata',
    'digest_in_name',
    'encode_metadata',
    'from_micros',
    'micros',
    'now_micros',
    'strategy_key',
)
