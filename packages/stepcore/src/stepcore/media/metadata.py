"""A blob's metadata as stored: a JSON object of strings, checked on the way in and on the way out."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from stepcore.media.protocol import MediaContext

__all__ = ('BlobMeta', 'RawMetadata', 'decode_metadata', 'encode_metadata')

RawMetadata = str | bytes | Mapping[str, Any] | None
"""Metadata as a port read it: the JSON text it stored, a mapping its driver already parsed, or `None`."""


@dataclass(frozen=True, slots=True)
class BlobMeta:
    """What a `put` stores beside the bytes, from its `MediaContext` (metadata checked)."""

    media_type: str | None
    filename: str | None
    metadata: Mapping[str, str]
    """Empty when the put carried none: a store then keeps no metadata and `get_metadata` is `None`."""

    @classmethod
    def of(cls, context: MediaContext) -> BlobMeta:
        metadata = cast(object, context.metadata)
        if not isinstance(metadata, Mapping):
            raise ValueError(f'MediaContext.metadata={metadata!r} is not a mapping: pass a dict of str to str')
        for key, value in cast(Mapping[object, object], metadata).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(
                    f'MediaContext.metadata entry {key!r}: {value!r} is not str to str: '
                    'media metadata maps strings to strings (convert numbers and other values with str())'
                )
        return cls(media_type=context.media_type, filename=context.filename, metadata=dict(context.metadata))

    @property
    def text(self) -> str | None:
        """The metadata as stored, `None` when there is none."""
        return encode_metadata(self.metadata)


def encode_metadata(metadata: Mapping[str, str]) -> str | None:
    """The JSON text a store keeps for `metadata`; `None` for an empty mapping (nothing is stored)."""
    return json.dumps(dict(metadata), ensure_ascii=False) if metadata else None


def decode_metadata(raw: RawMetadata) -> dict[str, str] | None:
    """Stored metadata back as a dict of strings, `None` when there is none; `ValueError` when it is
    not a JSON object."""
    if raw is None:
        return None
    value: object = json.loads(raw) if isinstance(raw, str | bytes) else raw
    if not isinstance(value, Mapping):
        raise ValueError(f'its metadata is {type(value).__name__} {value!r}, not a JSON object of strings')
    # Stores once kept whatever JSON a put gave them: a value that is not text reads back as text.
    out = {str(key): str(item) for key, item in cast(Mapping[object, object], value).items()}
    return out or None
