"""How message bodies are laid out in their column (records' bodies are the engine's to encode).

Message bodies larger than a few hundred bytes are zlib-compressed when that saves space. A stored
body is either a zlib stream (its first byte names the deflate method, `0x?8`) or the plain JSON
of the message (it starts with `{`), so rows written either way read back the same.

Bodies are compressed with a 4 KiB window and a small hash table instead of zlib's defaults
(32 KiB and 256 KiB of state): a message body is a few KiB, so the output is the same size within
a few bytes, and setting up the default state cost three times the compression itself.
"""

from __future__ import annotations

import zlib

__all__ = ('pack_body', 'unpack_body')

COMPRESS_MIN_BYTES = 256
"""Bodies shorter than this are stored as they are."""
_ZLIB_LEVEL = 6
_ZLIB_WINDOW_BITS = 12
_ZLIB_MEM_LEVEL = 5
_DEFLATE = 8
"""Low nibble of a zlib stream's first byte; `{` (0x7b), the first byte of a JSON body, never has it."""


def pack_body(body: bytes) -> bytes:
    """The stored form of one message body: compressed when that saves at least a tenth."""
    if len(body) < COMPRESS_MIN_BYTES:
        return body
    compressor = zlib.compressobj(_ZLIB_LEVEL, zlib.DEFLATED, _ZLIB_WINDOW_BITS, _ZLIB_MEM_LEVEL)
    packed = compressor.compress(body) + compressor.flush()
    return packed if len(packed) * 10 <= len(body) * 9 else body


def unpack_body(stored: bytes) -> bytes:
    """A message body back from its stored form."""
    if stored and stored[0] & 0x0F == _DEFLATE:
        return zlib.decompress(stored)  # the window size is read from the stream's header
    return stored
