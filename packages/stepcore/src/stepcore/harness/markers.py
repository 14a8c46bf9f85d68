"""Externalized-media markers in pydantic-ai-harness snapshots, put back inline.

pydantic-ai-harness stores a large payload apart from a snapshot's message JSON and leaves a marker
in its place: a dict flagged `__harness_external_media__: true`, carrying every field of the
original except the one moved out (`content` for text, `data` for binary content), the payload's
`media+sha256://` URI, and a few bookkeeping keys. Reading a harness store, stepcore turns each
marker back into the original dict, so the messages validate as pydantic-ai messages and the target
store externalizes them again under its own rules.

The shapes, as the releases from 0.20 to 0.62 write them:

- the URI is under `__harness_external_uri__`, mirrored to `uri` when the original had no `uri` of
  its own; a marker without the namespaced key keeps its URI in `uri` alone;
- `__harness_external_text__: true` marks text: the payload is UTF-8 (unpaired surrogates
  passed through) and goes back into `content`; anything else is binary and goes back into `data`
  as base64, URL-safe when `__harness_external_urlsafe__` holds `base64-urlsafe-v1`, standard
  otherwise;
- fields of the original that collided with the marker's own keys are kept in
  `__harness_external_escaped_keys__`, with `__harness_external_marker_format__` set to
  `escaped-keys-v1`; both must look like that before they are read so (an older payload may
  carry either key as its own data);
- a dict that was not externalized but carried a reserved key itself is wrapped as
  `{"__harness_external_literal__": <dict>, "__harness_external_marker_format__": "literal-v1"}`.

A later format version of either stamp is refused with a `ValueError`, never guessed at.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, cast

__all__ = ('HARNESS_MARKER_PREFIX', 'restore_harness_media')

HARNESS_MARKER_PREFIX = '__harness_external_'
"""Every key the harness adds to stored message JSON starts with this."""

_EXTERNAL = '__harness_external_media__'
_TEXT = '__harness_external_text__'
_URI = '__harness_external_uri__'
_ESCAPED = '__harness_external_escaped_keys__'
_FORMAT = '__harness_external_marker_format__'
_URLSAFE = '__harness_external_urlsafe__'
_LITERAL = '__harness_external_literal__'
_BOOKKEEPING = frozenset({_EXTERNAL, _TEXT, _URI, _ESCAPED, _FORMAT, _URLSAFE})
"""The keys a marker may have moved aside into its escaped-keys entry."""
_URLSAFE_STAMP = 'base64-urlsafe-v1'
_ESCAPED_FAMILY, _ESCAPED_VERSION = 'escaped-keys-v', 'escaped-keys-v1'
_LITERAL_FAMILY, _LITERAL_VERSION = 'literal-v', 'literal-v1'

Blob = Callable[[str], bytes]
"""Returns the bytes stored under a `media+sha256://` URI (raising `LookupError` when there are none)."""


def restore_harness_media(value: Any, blob: Blob) -> Any:
    """`value` (JSON data of stored messages) with every harness marker replaced by its payload.

    Returns a new structure; `value` is not changed. Raises `ValueError` for a marker this reader
    does not understand and whatever `blob` raises for a payload that is not there.
    """
    if isinstance(value, list):
        return [restore_harness_media(item, blob) for item in cast(list[Any], value)]
    if not isinstance(value, dict):
        return value
    mapping = cast(dict[str, Any], value)
    wrapped = _literal_payload(mapping)
    if wrapped is not None:
        mapping = wrapped  # the caller's own dict: its keys are data, not a marker
    elif mapping.get(_EXTERNAL) is True:
        return _restore_marker(mapping, blob)
    return {key: restore_harness_media(item, blob) for key, item in mapping.items()}


def _literal_payload(mapping: dict[str, Any]) -> dict[str, Any] | None:
    if mapping.keys() != {_LITERAL, _FORMAT}:
        return None
    stamp, payload = mapping[_FORMAT], mapping[_LITERAL]
    if not isinstance(stamp, str) or not stamp.startswith(_LITERAL_FAMILY) or not isinstance(payload, dict):
        return None
    if stamp != _LITERAL_VERSION:
        raise ValueError(
            f'harness media wrapper has format {stamp!r}; this stepcore reads {_LITERAL_VERSION!r} only: '
            'upgrade stepcore to import it'
        )
    return cast(dict[str, Any], payload)


def _escaped_fields(marker: dict[str, Any]) -> dict[str, Any] | None:
    """The original's fields a marker moved aside, or `None` when it moved none."""
    stash, stamp = marker.get(_ESCAPED), marker.get(_FORMAT)
    if not (isinstance(stash, dict) and stash and isinstance(stamp, str) and stamp.startswith(_ESCAPED_FAMILY)):
        return None
    fields = cast(dict[str, Any], stash)
    if not fields.keys() <= _BOOKKEEPING:
        return None
    if stamp != _ESCAPED_VERSION:
        raise ValueError(
            f'harness media marker has format {stamp!r}; this stepcore reads {_ESCAPED_VERSION!r} only: '
            'upgrade stepcore to import it'
        )
    return fields


def _restore_marker(marker: dict[str, Any], blob: Blob) -> dict[str, Any]:
    dropped = {_EXTERNAL, _TEXT}
    urlsafe = marker.get(_URLSAFE) == _URLSAFE_STAMP
    if urlsafe:
        dropped.add(_URLSAFE)
    escaped = _escaped_fields(marker)
    if escaped is not None:
        dropped |= {_ESCAPED, _FORMAT}
    if _URI in marker:
        uri = marker[_URI]
        dropped.add(_URI)
        if marker.get('uri') == uri:
            dropped.add('uri')  # the mirror, not a field of the original
    else:
        uri = marker.get('uri')
        dropped.add('uri')
    if not isinstance(uri, str):
        raise ValueError(f'harness media marker has no media URI (keys: {sorted(marker)})')
    data = blob(uri)
    restored = {key: restore_harness_media(item, blob) for key, item in marker.items() if key not in dropped}
    if escaped is not None:
        restored.update({key: restore_harness_media(item, blob) for key, item in escaped.items()})
    if marker.get(_TEXT) is True:
        restored['content'] = data.decode('utf-8', errors='surrogatepass')
    elif urlsafe:
        restored['data'] = base64.urlsafe_b64encode(data).decode('ascii')
    else:
        restored['data'] = base64.b64encode(data).decode('ascii')
    return restored
