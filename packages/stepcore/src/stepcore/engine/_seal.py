"""Sealing stored bodies: a checksum on every record and message, and encryption when asked.

The engine seals each body it hands a port and opens each body a port hands back, so every store
gets both without code of its own. Sealed bodies stay JSON objects, which every port can keep in
its native form (a JSON column, a document field, a line of a file).

**Records** (run, event, ledger entry, snapshot header) are stamped with format version 2 and:

- in clear, a checksum field `c`: 64-bit BLAKE2b over the record's canonical JSON (the format
  stamp first, then the other fields with keys sorted, compact, without the fields a port adds
  beside the body) and over the row's columns that the engine reads back into the record (run id;
  tool call id and status of a ledger entry; state and length of a snapshot). A port may hand the
  body back as bytes, text or a mapping: all give the same sum. The body is stored as that
  canonical JSON with `c` right after the stamp, so a body handed back as written is checked by
  hashing its bytes, without parsing it (`Sealer.check_record`). Records written before this
  layout summed their fields all sorted; they still check.
- encrypted, `{"format":2,...,"k":key id,"f":key fingerprint,"e":base64 AES-GCM ciphertext}`, the
  columns above and the fields kept in clear (`...`: those a port indexes or reads to find a record,
  e.g. a ledger entry's call id, status and start time) as the associated data: the GCM tag is the
  integrity check.

**Message nodes** end with a field `"_s":"<sum>:<prev>"`: the node's sum over its message bytes and
`prev`, the sum of the message before it in its history (zeros for a history's first message). So
every node checks itself and the link to its parent; a snapshot header keeps the sum of its newest
message (`h`), which pins the head its row points to. Encrypted, the node so stamped is the
plaintext of `{"k","f","e"}` with the run id as associated data.

A record of format 1 (written before checksums) loads without one; a format-2 record without its
checksum or ciphertext is damaged.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from stepcore.common.encryption import Encryption, EncryptionKeyError
from stepcore.store.codec import FORMAT_KEY, Record, check_format_version, record_fields, record_json
from stepcore.store.models import RECORD_FORMAT_VERSION

__all__ = (
    'CHECKSUM_KEY',
    'HEAD_KEY',
    'NO_PREV',
    'SEALED_FORMAT',
    'MessageDamage',
    'Sealer',
    'key_id_of',
    'node_sum',
)

SEALED_FORMAT: Final = 2
"""The record format whose bodies carry a checksum or a ciphertext."""
CHECKSUM_KEY: Final = 'c'
HEAD_KEY: Final = 'h'
"""A snapshot header's field holding the sum of its newest message."""
_KEY_ID: Final = 'k'
_FINGERPRINT: Final = 'f'
_CIPHERTEXT: Final = 'e'
_NOT_SHOWN: Final = frozenset({FORMAT_KEY, CHECKSUM_KEY, _KEY_ID, _FINGERPRINT, _CIPHERTEXT})
"""Fields of an encrypted record's envelope that are not clear fields of the record."""

NO_PREV: Final = '0' * 16
"""The `prev` of a history's first message."""
_NODE_MARK: Final = b',"_s":"'
_NODE_TAIL: Final = len(_NODE_MARK) + 16 + 1 + 16 + 2
"""Bytes of a node's sum field, from its comma to the closing brace."""
_ENCRYPTED_NODE: Final = b'{"k":"'
_KEY_ID_MARK: Final = b'"k":"'


def _sum(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _columns(columns: Sequence[object]) -> bytes:
    if len(columns) == 1 and type(columns[0]) is str:  # a run id: most records
        return columns[0].encode()
    if None in columns:
        return '\x1f'.join('' if c is None else str(c) for c in columns).encode()
    return '\x1f'.join(map(str, columns)).encode()


_CANONICAL: Final = json.JSONEncoder(sort_keys=True, separators=(',', ':'), ensure_ascii=False)
"""`json.dumps(..., sort_keys=True, separators=(',', ':'), ensure_ascii=False)`, built once."""

_MAKE_ENCODER: Any = getattr(json.encoder, 'c_make_encoder', None)
_SORTED_JSON: Any = (
    None
    if _MAKE_ENCODER is None
    else _MAKE_ENCODER(None, _CANONICAL.default, json.encoder.encode_basestring, None, ':', ',', True, False, True)
)
"""`_CANONICAL`'s C encoder, built once rather than at every `encode` (which builds one per call), and
without its check for circular references: it encodes only the fields pydantic's JSON mode gave,
which hold none. The same settings, so the same text."""


def _sorted_json(data: Mapping[str, Any]) -> bytes:
    """`_CANONICAL.encode(data)`, as UTF-8."""
    if _SORTED_JSON is None:
        return _CANONICAL.encode(data).encode()
    return ''.join(_SORTED_JSON(data, 0)).encode()


_STAMP_FIELD: Final = frozenset({FORMAT_KEY})


def _canonical(data: Mapping[str, Any], skip: frozenset[str]) -> bytes:
    kept = {k: v for k, v in data.items() if k not in skip}
    return _CANONICAL.encode(kept).encode()


def _canonical_record(data: Mapping[str, Any], skip: frozenset[str]) -> bytes:
    """What a record's checksum covers: its format stamp, then its other fields (keys sorted, compact)."""
    rest = _canonical(data, skip | _STAMP_FIELD)
    stamp_value = data.get(FORMAT_KEY)
    if type(stamp_value) is int and stamp_value == SEALED_FORMAT:  # a record of the current format
        stamp = _STAMP
    else:
        stamp = b'{"' + FORMAT_KEY.encode() + b'":' + json.dumps(stamp_value).encode()
    return stamp + (b'}' if rest == b'{}' else b',' + rest[1:])


def _field(name: str, value: Any) -> bytes:
    return json.dumps(name).encode() + b':' + json.dumps(value, ensure_ascii=False, separators=(',', ':')).encode()


def node_sum(message: bytes, prev: str) -> str:
    """The sum of one stored message (its bytes without the sum field) following `prev`."""
    return _sum(message + prev.encode())


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: object, what: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f'{what} holds no ciphertext text')
    return base64.b64decode(text, validate=True)


_STAMP: Final = b'{"' + FORMAT_KEY.encode() + b'":' + str(SEALED_FORMAT).encode()
_SEALED_HEAD: Final = _STAMP + b',"' + CHECKSUM_KEY.encode() + b'":"'
"""How a record body sealed in clear starts, as written."""
_SUM_END: Final = len(_SEALED_HEAD) + 16


def key_id_of(body: object) -> str | None:
    """The key id an encrypted body (record or message node) names; `None` for one in clear."""
    data: Any = body
    if isinstance(body, bytes | str):
        if _KEY_ID_MARK not in (body.encode() if isinstance(body, str) else body):
            return None
        try:
            data = json.loads(body)
        except ValueError:
            return None
    if isinstance(data, Mapping):
        key_id = cast(Mapping[str, Any], data).get(_KEY_ID)
        return key_id if isinstance(key_id, str) else None
    return None


def _checks_as_written(body: bytes, columns: Sequence[object]) -> bool:
    """Whether `body` is a record sealed in clear, exactly as `Sealer.record` wrote it, whose sum checks."""
    if not body.startswith(_SEALED_HEAD) or body[_SUM_END : _SUM_END + 1] != b'"':
        return False
    canonical = _STAMP + body[_SUM_END + 1 :]
    return _sum(canonical + b'\x00' + _columns(columns)).encode() == body[len(_SEALED_HEAD) : _SUM_END]


class MessageDamage(ValueError):
    """A message of a snapshot that does not check; `position` is its index in the history."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f'message {position} {reason}')
        self.position = position
        self.reason = reason


class Sealer:
    """Seals and opens the engine's bodies, with checksums and, given `encryption`, AES-GCM."""

    def __init__(self, encryption: Encryption | None = None) -> None:
        self.encryption = encryption

    # -- records -------------------------------------------------------------------------------

    def record(self, body: bytes | Mapping[str, Any], columns: Sequence[object], clear: Sequence[str] = ()) -> bytes:
        """A record body from `dump_record_compact` (format 2), or its fields from `record_fields`,
        sealed with its columns.

        Encrypted, the `clear` fields (those a port indexes or reads to find the record) stay in
        clear beside the ciphertext, covered by it as associated data. Given the fields, a record
        sealed in clear is encoded once, straight into its canonical form.
        """
        if isinstance(body, bytes):
            if not body.startswith(_STAMP):
                raise ValueError(f'a record body to seal must start with {_STAMP!r}')
        elif body.get(FORMAT_KEY) != SEALED_FORMAT:
            raise ValueError(f'a record to seal must be of format {SEALED_FORMAT}')
        if self.encryption is None:
            canonical = _canonical_record(json.loads(body) if isinstance(body, bytes) else body, frozenset())
            check = _sum(canonical + b'\x00' + _columns(columns))
            return _SEALED_HEAD + check.encode() + b'"' + canonical[len(_STAMP) :]
        if isinstance(body, bytes):
            plain, fields = body, None
        else:
            plain, fields = json.dumps(body, separators=(',', ':'), ensure_ascii=False).encode(), body
        shown: dict[str, Any] = {}
        if clear:
            if fields is None:
                fields = cast(Mapping[str, Any], json.loads(plain))
            shown = {name: fields[name] for name in clear if name in fields}
        key_id, fp, blob = self.encryption.encrypt(plain, _columns(columns) + b'\x00' + _canonical(shown, _NOT_SHOWN))
        head = _STAMP + b''.join(b',' + _field(name, value) for name, value in shown.items())
        return b'%s,"k":"%s","f":"%s","e":"%s"}' % (head, key_id.encode(), fp.encode(), _b64(blob).encode())

    def seal(
        self,
        record: Record,
        exclude: frozenset[str],
        columns: Sequence[object],
        clear: Sequence[str] = (),
        extra: Mapping[str, str] | None = None,
    ) -> bytes:
        """`record(record_fields(record, exclude=exclude, **extra), columns, clear)`: the same bytes.

        In clear, the fields are encoded once, without the format stamp (which every record of the
        current format starts with), and the checksum is taken over the stamp and that text.
        """
        if self.encryption is not None or RECORD_FORMAT_VERSION != SEALED_FORMAT:
            return self.record(record_fields(record, exclude=exclude, **(extra or {})), columns, clear)
        fields = record_json(record, exclude, extra)
        # `_sorted_json`, `_columns` and `_sum`, inline: this runs for every record written
        rest = ''.join(_SORTED_JSON(fields, 0)).encode() if _SORTED_JSON is not None else _sorted_json(fields)
        tail = b'}' if rest == b'{}' else b',' + rest[1:]
        sealed = columns[0].encode() if len(columns) == 1 and type(columns[0]) is str else _columns(columns)
        check = hashlib.blake2b(_STAMP + tail + b'\x00' + sealed, digest_size=8).hexdigest()
        return _SEALED_HEAD + check.encode() + b'"' + tail

    def check_record(self, body: bytes | str, columns: Sequence[object]) -> bool:
        """Whether a stored record body in clear is laid out as `record` wrote it and its checksum
        checks, by hashing its bytes without parsing them. False says nothing: the body may be laid
        out otherwise (a port added a field, an older layout, encrypted), and `open_record` decides."""
        return _checks_as_written(body.encode() if isinstance(body, str) else body, columns)

    def open_record(
        self, body: bytes | str | Mapping[str, Any], in_row: frozenset[str], columns: Sequence[object]
    ) -> dict[str, Any]:
        """The fields of a stored record, its seal checked; `ValueError` when it does not check,
        `EncryptionKeyError` when its key is not held."""
        if isinstance(body, bytes | str) and self.check_record(body, columns):
            opened = cast(dict[str, Any], json.loads(body))
            del opened[CHECKSUM_KEY]
            return opened
        raw: Any = json.loads(body) if isinstance(body, str | bytes) else dict(body)
        if not isinstance(raw, dict):
            raise ValueError(f'a stored record must be a JSON object, found {type(raw).__name__}')
        data = cast(dict[str, Any], raw)
        check_format_version(data.get(FORMAT_KEY, 1), what='stored record')  # a newer format: refused as such
        if _CIPHERTEXT in data or _KEY_ID in data:
            aad = _columns(columns) + b'\x00' + _canonical(data, _NOT_SHOWN | in_row)
            plain = self._decrypt(data, aad, 'record')
            opened: Any = json.loads(plain)
            if not isinstance(opened, dict):
                raise ValueError('the decrypted record is not a JSON object')
            return cast(dict[str, Any], opened)
        check = data.get(CHECKSUM_KEY)
        if check is None:
            version = data.get(FORMAT_KEY, 1)
            if isinstance(version, int) and version >= SEALED_FORMAT:
                raise ValueError(f'the record is of format {version} but carries no checksum')
            return data
        sealed_columns = b'\x00' + _columns(columns)
        expected = _sum(_canonical_record(data, in_row | {CHECKSUM_KEY}) + sealed_columns)
        if check != expected and check == _sum(_canonical(data, in_row | {CHECKSUM_KEY}) + sealed_columns):
            expected = check  # written before the stamp-first layout
        if check != expected:
            raise ValueError(f'checksum mismatch (stored {check!r}, computed {expected!r}): the record was altered')
        del data[CHECKSUM_KEY]
        return data

    def _decrypt(self, data: Mapping[str, Any], aad: bytes, what: str) -> bytes:
        key_id, fp = data.get(_KEY_ID), data.get(_FINGERPRINT)
        if not isinstance(key_id, str) or not isinstance(fp, str):
            raise ValueError(f'the encrypted {what} lacks its key id or key fingerprint')
        if self.encryption is None:
            raise EncryptionKeyError(
                f'stored data is encrypted with key {key_id!r} and the store was given no keys: '
                f'open it with encryption=stepcore.Encryption(keys={{{key_id!r}: ...}})',
                key_id=key_id,
            )
        return self.encryption.decrypt(key_id, fp, _unb64(data.get(_CIPHERTEXT), f'the encrypted {what}'), aad)

    # -- message nodes -------------------------------------------------------------------------

    def nodes(self, run_id: str, messages: Sequence[bytes], prev: str) -> tuple[list[bytes], list[str]]:
        """Stored message bodies (stored form, a JSON object each) sealed as one chain after `prev`:
        `(sealed bodies, their sums)`."""
        sealed: list[bytes] = []
        sums: list[str] = []
        aad = run_id.encode()
        for message in messages:
            if not message.endswith(b'}'):
                raise ValueError('a stored message must be a JSON object')
            check = node_sum(message, prev)
            body = b'%s%s%s:%s"}' % (message[:-1], _NODE_MARK, check.encode(), prev.encode())
            if self.encryption is not None:
                key_id, fp, blob = self.encryption.encrypt(body, aad)
                body = b'{"k":"%s","f":"%s","e":"%s"}' % (key_id.encode(), fp.encode(), _b64(blob).encode())
            sealed.append(body)
            sums.append(check)
            prev = check
        return sealed, sums

    def open_nodes(self, run_id: str, bodies: Sequence[bytes], head: str | None, *, sealed: bool) -> list[bytes]:
        """The stored messages of one snapshot (oldest first) from their node bodies, each node and
        each link checked and the newest against the header's `head` sum. Under a header of
        `sealed` format every node must carry its sum; under an older one a node without is taken
        as it is. `ValueError` naming the message that does not check."""
        opened: list[bytes] = []
        prev = NO_PREV
        aad = run_id.encode()
        for position, body in enumerate(bodies):
            if body.startswith(_ENCRYPTED_NODE):
                data: Any = json.loads(body)
                if not isinstance(data, dict):
                    raise MessageDamage(position, 'is not a JSON object')
                try:
                    body = self._decrypt(cast(dict[str, Any], data), aad, f'message {position}')
                except ValueError as error:
                    raise MessageDamage(position, f'does not decrypt: {error}') from error
            if len(body) < _NODE_TAIL or body[-_NODE_TAIL : -_NODE_TAIL + len(_NODE_MARK)] != _NODE_MARK:
                if sealed:
                    raise MessageDamage(position, 'carries no checksum')
                opened.append(body)
                prev = ''
                continue
            tail = body[-_NODE_TAIL + len(_NODE_MARK) : -2].decode('ascii')
            check, _, stored_prev = tail.partition(':')
            message = body[:-_NODE_TAIL] + b'}'
            if node_sum(message, stored_prev) != check:
                raise MessageDamage(position, 'fails its checksum: it was altered')
            if prev and stored_prev != prev:
                raise MessageDamage(position, f'does not follow message {position - 1}: the chain was altered')
            opened.append(message)
            prev = check
        if sealed and bodies and head is not None and prev != head:
            raise ValueError('the newest message is not the one the snapshot was saved with')
        if sealed and bodies and head is None:
            raise ValueError('the snapshot carries no sum of its newest message')
        return opened
