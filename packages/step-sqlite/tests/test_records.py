"""Stored message bodies: compressed when that pays, and every stored form reads back."""

from __future__ import annotations

import json
import random
import zlib

from step_sqlite.records import COMPRESS_MIN_BYTES, pack_body, unpack_body


def _body(payload_bytes: int) -> bytes:
    content = random.Random(payload_bytes).randbytes(payload_bytes // 2).hex()
    return json.dumps({'kind': 'request', 'parts': [{'part_kind': 'tool-return', 'content': content}]}).encode()


def test_large_bodies_are_compressed_and_read_back() -> None:
    for size in (COMPRESS_MIN_BYTES, 2048, 8192, 200_000):
        body = _body(size)
        packed = pack_body(body)
        assert len(packed) * 10 <= len(body) * 9
        assert unpack_body(packed) == body


def test_small_bodies_are_stored_as_they_are() -> None:
    body = b'{"kind":"request","parts":[]}'
    assert pack_body(body) == body
    assert unpack_body(body) == body


def test_incompressible_bodies_are_stored_as_they_are() -> None:
    body = b'{' + random.Random(1).randbytes(4000)  # stands for a body zlib cannot shrink
    assert len(zlib.compress(body)) * 10 > len(body) * 9  # the premise: compression saves under a tenth
    assert pack_body(body) == body
    assert unpack_body(body) == body


def test_bodies_compressed_with_any_zlib_window_read_back() -> None:
    # Rows written with zlib's default settings (first byte 0x78) and with small windows all read.
    body = _body(4096)
    for window_bits in (9, 12, 15):
        compressor = zlib.compressobj(6, zlib.DEFLATED, window_bits)
        stored = compressor.compress(body) + compressor.flush()
        assert unpack_body(stored) == body
    assert unpack_body(zlib.compress(body)) == body
