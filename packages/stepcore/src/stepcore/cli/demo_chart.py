"""The demo's chart: nightly export times for the week, drawn as a small PNG with the standard library.

The report tool writes it beside the report and returns it to the model, so the stored history
holds an image (shown inline by `stepcore ui`). The bytes are the same on every run.
"""

from __future__ import annotations

import struct
import zlib

__all__ = ('CHART_FILE', 'EXPORT_MINUTES', 'chart_png')

CHART_FILE = 'export-times.png'
EXPORT_MINUTES = (22, 24, 21, 23, 62, 25, 22)
"""Minutes the nightly export took, Monday to Sunday: Friday's ran 40 minutes late."""

_WIDTH, _HEIGHT = 224, 120
_Colour = tuple[int, int, int]
_BACKGROUND: _Colour = (248, 249, 251)
_AXIS: _Colour = (120, 126, 138)
_BAR: _Colour = (76, 120, 191)
_LATE: _Colour = (214, 92, 72)
_LATE_FROM = 40


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack('>I', len(data)) + body + struct.pack('>I', zlib.crc32(body) & 0xFFFFFFFF)


def chart_png() -> bytes:
    """A bar chart of `EXPORT_MINUTES` as PNG bytes (late runs in red)."""
    pixels: list[list[_Colour]] = [[_BACKGROUND] * _WIDTH for _ in range(_HEIGHT)]
    base, top, left = _HEIGHT - 12, 10, 12
    scale = (base - top) / max(EXPORT_MINUTES)
    slot = (_WIDTH - 2 * left) // len(EXPORT_MINUTES)
    for day, minutes in enumerate(EXPORT_MINUTES):
        colour = _LATE if minutes >= _LATE_FROM else _BAR
        height = round(minutes * scale)
        x0 = left + day * slot + 4
        for y in range(base - height, base):
            for x in range(x0, x0 + slot - 8):
                pixels[y][x] = colour
    for x in range(left - 4, _WIDTH - left + 4):
        pixels[base][x] = _AXIS
    raw = b''.join(b'\x00' + bytes(c for pixel in row for c in pixel) for row in pixels)
    header = struct.pack('>IIBBBBB', _WIDTH, _HEIGHT, 8, 2, 0, 0, 0)
    return (
        b'\x89PNG\r\n\x1a\n' + _chunk(b'IHDR', header) + _chunk(b'IDAT', zlib.compress(raw, 9)) + _chunk(b'IEND', b'')
    )
