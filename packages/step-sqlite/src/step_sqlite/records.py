"""How records and message bodies are laid out in their columns.

Records are stored as compact JSON stamped with stepcore's record format version. Fields the row
already holds in a column (the run id, the seq) and fields left at a `None` default are not
repeated in the JSON; reading fills them back in, so a record round-trips exactly.

Message bodies larger than a few hundred bytes are zlib-compressed when that saves space. A stored
body is either compressed (it starts with the zlib header byte `x`) or the plain JSON of the
message (it starts with `{`), so rows written either way read back the same.
"""

from __future__ import annotations

import zlib
from typing import Any, TypeVar

from pydantic import BaseModel

from stepcore.codec import dump_record_compact, load_record

__all__ = ('dump_compact', 'load_compact', 'pack_body', 'unpack_body')

R = TypeVar('R', bound=BaseModel)

COMPRESS_MIN_BYTES = 256
"""Bodies shorter than this are stored as they are."""
_ZLIB_LEVEL = 6
_ZLIB_HEADER = 0x78


def dump_compact(record: BaseModel, *, exclude: set[str]) -> str:
    """`record` as compact JSON without the `exclude`d fields and fields left at `None`."""
    return dump_record_compact(record, exclude=exclude).decode()


def load_compact(cls: type[R], text: str | bytes, **columns: Any) -> R:
    """A record back from `dump_compact` output plus the values its row keeps in columns."""
    return load_record(cls, text, **columns)


def pack_body(body: bytes) -> bytes:
    """The stored form of one message body: compressed when that saves at least a tenth."""
    if len(body) < COMPRESS_MIN_BYTES:
        return body
    packed = zlib.compress(body, _ZLIB_LEVEL)
    return packed if len(packed) * 10 <= len(body) * 9 else body


def unpack_body(stored: bytes) -> bytes:
    """A message body back from its stored form."""
    if stored[:1] == bytes((_ZLIB_HEADER,)):
        return zlib.decompress(stored)
    return stored
