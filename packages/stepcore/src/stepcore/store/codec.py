"""Versioned (de)serialization of stored records and of pydantic-ai messages.

Every stored record carries the format version it was written with. A reader refuses a record
from a newer format instead of guessing at it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Final, TypeVar

import pydantic
from pydantic import ValidationError
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, ModelResponse
from pydantic_core import ErrorDetails

from stepcore.common.damage import WrongTypes
from stepcore.store.models import RECORD_FORMAT_VERSION, ContinuableSnapshot, RunRecord, StepEvent, ToolEffectRecord

__all__ = (
    'FORMAT_KEY',
    'PLAIN_FORMAT_VERSION',
    'check_format_version',
    'decode_messages',
    'dump_record',
    'dump_record_compact',
    'dump_record_json',
    'encode_message',
    'encode_messages',
    'load_record',
    'record_fields',
    'record_json',
    'validated',
)

FORMAT_KEY = 'format'
Record = RunRecord | StepEvent | ContinuableSnapshot | ToolEffectRecord
R = TypeVar('R', RunRecord, StepEvent, ContinuableSnapshot, ToolEffectRecord)

_MESSAGE_CONFIG = pydantic.ConfigDict(ser_json_bytes='base64', val_json_bytes='base64')
_MESSAGE_ADAPTER: pydantic.TypeAdapter[ModelRequest | ModelResponse] = pydantic.TypeAdapter(  # pyright: ignore[reportUnknownVariableType]
    ModelMessage,  # pyright: ignore[reportArgumentType]  # an Annotated union is a valid TypeAdapter target
    config=_MESSAGE_CONFIG,
)
# One adapter per message class, for encoding: the union's serializer takes about twice as long
# as a response's own, and encoding runs for every message saved. A list is the adapters' type
# because a dataclass cannot take the config that writes bytes inside `Any` fields (such as
# `provider_details`) as base64, as the union does; the brackets are cut off, so the output is
# the union's, byte for byte.
_REQUESTS = pydantic.TypeAdapter(list[ModelRequest], config=_MESSAGE_CONFIG)
_RESPONSES = pydantic.TypeAdapter(list[ModelResponse], config=_MESSAGE_CONFIG)


def check_format_version(version: object, *, what: str = 'record') -> None:
    """Raise `ValueError` when `version` is not a format this release can read."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f'{what} has an invalid format version {version!r}: expected an integer >= 1')
    if version > RECORD_FORMAT_VERSION:
        raise ValueError(
            f'{what} was written with format version {version}, newer than this stepcore reads '
            f'(up to {RECORD_FORMAT_VERSION}): upgrade stepcore to read it'
        )


PLAIN_FORMAT_VERSION = 1
"""The format of a record as plain JSON, without the checksum a store's body carries (format 2)."""


def dump_record(record: Record, *, exclude: set[str] | None = None) -> dict[str, Any]:
    """A JSON-compatible dict of `record`, stamped with the plain record format version (1): the
    form of an export document, which carries no checksums. Fields go under their stored names."""
    data = record.model_dump(mode='json', exclude=exclude, by_alias=True)
    data[FORMAT_KEY] = PLAIN_FORMAT_VERSION
    return data


def dump_record_json(record: Record, *, exclude: set[str] | None = None) -> str:
    """`dump_record` as a compact JSON string."""
    return json.dumps(dump_record(record, exclude=exclude), separators=(',', ':'), ensure_ascii=False)


def dump_record_compact(record: Record, *, exclude: AbstractSet[str] | None = None, **extra: int | str) -> bytes:
    """`record` as compact JSON (UTF-8), stamped with the format version, in one serializer pass.

    `None` fields and an empty `metadata` are left out (they load back as their defaults; every
    optional field of the stored records defaults to `None`), as are the `exclude`d fields a store
    keeps elsewhere. `extra` fields (e.g. a store-assigned `seq`) replace the record's own.
    """
    skip = _skipped(record, exclude, extra)
    body: bytes = record.__pydantic_serializer__.to_json(record, exclude=skip, exclude_none=True, by_alias=True)
    head = _COMPACT_HEAD
    if extra:
        head += b''.join(b',' + _json_bytes(key) + b':' + _json_bytes(value) for key, value in extra.items())
    if body == b'{}':
        return head + b'}'
    return head + b',' + body[1:]


def record_fields(record: Record, *, exclude: AbstractSet[str] | None = None, **extra: int | str) -> dict[str, Any]:
    """`dump_record_compact` as the JSON-compatible dict it encodes (format stamp first, then the
    record's fields, then `extra`), without encoding it: for a caller that re-encodes it anyway."""
    fields: dict[str, Any] = {FORMAT_KEY: RECORD_FORMAT_VERSION}
    fields.update(record_json(record, frozenset(exclude or ()), extra))
    return fields


def record_json(
    record: Record, exclude: frozenset[str], extra: Mapping[str, int | str] | None = None
) -> dict[str, Any]:
    """`record_fields` without its format stamp: the record's JSON-compatible fields, then `extra`.

    For the engine's write path, which seals each record it writes: the fields the record is
    serialized without (`exclude`, the `extra` names, and `metadata` when empty) are a set built
    once per kind of record and kept, not one built per record.
    """
    empty_metadata = getattr(record, 'metadata', None) == {}
    key = (exclude, tuple(extra) if extra else (), empty_metadata)
    skip = _SKIPS.get(key)
    if skip is None:
        skip = _SKIPS[key] = _skipped(record, exclude, extra or {})
    fields: dict[str, Any] = record.__pydantic_serializer__.to_python(
        record, mode='json', exclude=skip, exclude_none=True, by_alias=True
    )
    if extra:
        fields.update(extra)
    return fields


_SKIPS: dict[tuple[frozenset[str], tuple[str, ...], bool], set[str]] = {}
"""The fields `record_json` leaves out, by what it was asked to leave out (a handful of keys)."""


def _skipped(record: Record, exclude: AbstractSet[str] | None, extra: Mapping[str, object]) -> set[str]:
    skip = {*(exclude or ()), *extra}
    if getattr(record, 'metadata', None) == {}:
        skip.add('metadata')
    return skip


_COMPACT_HEAD = b'{"' + FORMAT_KEY.encode() + b'":' + str(RECORD_FORMAT_VERSION).encode()
"""The start of every `dump_record_compact` output, built once: it runs for each record written."""


def _json_bytes(value: int | str) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def load_record(cls: type[R], data: Mapping[str, Any] | str | bytes, **extra: Any) -> R:
    """Parse a stored record, refusing an unknown newer format version."""
    raw: dict[str, Any] = json.loads(data) if isinstance(data, str | bytes) else dict(data)
    check_format_version(raw.pop(FORMAT_KEY, 1), what=f'stored {cls.__name__}')
    raw.update(extra)
    return cls.model_validate(raw)


def encode_message(message: ModelMessage) -> bytes:
    """One message as compact JSON, with pydantic-ai's own serialization rules (bytes as base64)."""
    if type(message) is ModelResponse:
        return _RESPONSES.dump_json([message])[1:-1]
    if type(message) is ModelRequest:
        return _REQUESTS.dump_json([message])[1:-1]
    return _MESSAGE_ADAPTER.dump_json(message)  # a subclass: the union decides how it serializes


def encode_messages(messages: Iterable[ModelMessage]) -> list[bytes]:
    """`encode_message` for each message."""
    return [encode_message(m) for m in messages]


def decode_messages(encoded: Iterable[bytes | str]) -> list[ModelMessage]:
    """Messages back from `encode_message` output, validated in one pass by pydantic-ai's adapter."""
    parts = [e.encode() if isinstance(e, str) else e for e in encoded]
    return ModelMessagesTypeAdapter.validate_json(b'[' + b','.join(parts) + b']')


_SHOWN_VALUE: Final = 60
"""How many characters of a value at fault a message shows."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_VALUE else text[:_SHOWN_VALUE] + '...'


def _wrong_types(error: ValidationError, what: str, stored: Mapping[str, Any], kinds: Mapping[str, str]) -> str:
    unknown: list[str] = []
    wrong: list[str] = []
    problem: ErrorDetails
    for problem in error.errors(include_url=False):
        loc = problem['loc']
        field = loc[0] if len(loc) == 1 else None
        found: object = problem['input']
        missing = problem['type'] == 'missing'
        if isinstance(field, str) and found == '':
            # A port hands over a field it could not read from the record (a ledger entry's status,
            # a snapshot's state) as '': the value at fault is the one in the record's body.
            missing = field not in stored
            found = stored.get(field, found)
        if missing:
            wrong.append(f'{".".join(map(str, loc))}: missing')
        elif problem['type'] == 'enum' and isinstance(field, str) and field in kinds and isinstance(found, str):
            expected = (problem.get('ctx') or {}).get('expected')
            unknown.append(f'unknown {kinds[field]}: {_shown(found)}' + (f' (known: {expected})' if expected else ''))
        else:
            where = '.'.join(map(str, loc)) or 'the record'
            wrong.append(f'{where}: {problem["msg"]} (found {_shown(found)})')
    if wrong or not unknown:
        unknown.append(f'{what} has wrong types: ' + ('; '.join(wrong) or str(error).replace('\n', ' ')))
    return '; '.join(unknown)


def validated(
    cls: type[R], stored: Mapping[str, Any], *, what: str, kinds: Mapping[str, str] | None = None, **extra: Any
) -> R:
    """`load_record(cls, stored, **extra)`, with a record whose fields do not validate raised as
    `WrongTypes`: "<what> has wrong types: <field>: <problem> (found <value>)".

    `kinds` names the record's enumerated fields (`{'status': 'tool effect status'}`): a text value
    that is none of the field's members is told first, as "unknown tool effect status: 'sent'".
    """
    try:
        return load_record(cls, stored, **extra)
    except ValidationError as error:
        raise WrongTypes(_wrong_types(error, what, stored, kinds or {})) from error
