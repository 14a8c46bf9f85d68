"""User metadata as `x-amz-meta-*` headers: key checks and a value encoding that round-trips.

S3 carries user metadata in HTTP headers, so names must be header-safe and are lower-cased by the
service. Names are therefore limited to lowercase ASCII letters, digits and dashes, and anything
else is refused before a request is made (a name such as `Source` would read back as `source`).

Values are free text. A value that would not survive an HTTP header unchanged (non-ASCII, control
characters, leading or trailing blanks, or one that itself looks like an encoded word) is sent as
an RFC 2047 encoded word, `=?UTF-8?B?<base64>?=` — the form AWS S3 itself uses for non-ASCII
metadata — and decoded again on read.

The empty value is sent as the empty encoded word `=?UTF-8?B??=`, never as an empty header: S3
promises nothing for a header without a value, and S3-compatible services and proxies drop it, so
the name would vanish. Objects written with an empty header still read back as `''` where the
service kept it.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from email.errors import HeaderParseError
from email.header import decode_header, make_header

__all__ = ('MAX_METADATA_BYTES', 'decode_metadata', 'encode_metadata')

MAX_METADATA_BYTES = 2048
"""S3's limit on user-defined metadata: names plus values, as sent."""

_KEY_RE = re.compile(r'[a-z0-9]+(?:-+[a-z0-9]+)*')
_PLAIN_VALUE_RE = re.compile(r'[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?')
_EMPTY_VALUE = '=?UTF-8?B??='


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise ValueError(f'S3 metadata name {key!r} is not a string: use lowercase ASCII letters, digits and dashes')
    if _KEY_RE.fullmatch(key) is None:
        lowered = key.lower()
        hint = (
            f' (S3 lower-cases metadata names, so it would read back as {lowered!r}: pass {lowered!r})'
            if _KEY_RE.fullmatch(lowered)
            else ''
        )
        raise ValueError(
            f'S3 metadata name {key!r} is not allowed{hint}: use 1 or more lowercase ASCII letters, digits and '
            'dashes, not starting or ending with a dash'
        )
    return key


def _encode_value(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f'S3 metadata value for {key!r} is {type(value).__name__} {value!r}: pass a str')
    if value == '':
        return _EMPTY_VALUE
    if _PLAIN_VALUE_RE.fullmatch(value) and not value.startswith('=?'):
        return value
    return '=?UTF-8?B?' + base64.b64encode(value.encode('utf-8')).decode('ascii') + '?='


def encode_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """Check names and encode values for `x-amz-meta-*`; `ValueError` for a bad name or too much data."""
    encoded = {_check_key(key): '' for key in metadata}
    for key, value in metadata.items():
        encoded[key] = _encode_value(key, value)
    size = sum(len(key) + len(value) for key, value in encoded.items())
    if size > MAX_METADATA_BYTES:
        raise ValueError(
            f'S3 metadata is {size} bytes once encoded ({len(encoded)} entries), over the {MAX_METADATA_BYTES}-byte '
            'limit S3 puts on user metadata: store large values in the blob or elsewhere'
        )
    return encoded


def _decode_value(value: str) -> str:
    # Also accepts Q-encoding and split words, as a service may re-encode what it stored.
    if not (value.startswith('=?') and value.endswith('?=')):
        return value
    if value == _EMPTY_VALUE:
        return ''
    try:
        return str(make_header(decode_header(value)))
    except (HeaderParseError, UnicodeDecodeError, LookupError, ValueError):
        return value


def decode_metadata(headers: Mapping[str, str]) -> dict[str, str]:
    """The user metadata from a HEAD response's `Metadata` mapping."""
    return {key: _decode_value(value) for key, value in headers.items()}
