"""How the engine's rows are laid out as MongoDB documents, and read back.

A record document holds the engine's encoded body (compact JSON, as a string) in `body`, next to
the fields the store queries, sorts and indexes on (`run_id`, `seq`, `idempotency_key`, `state`,
`status`, `tool_call_id`, `conversation_id`, `parent_run_id`, `started_at`). The record's own
fields, metadata keys and tool arguments included, live only in the JSON, so they are free of
BSON's field-name rules.

Documents written before bodies (no `body` field: the record's fields spread over the document,
times as a BSON date plus a `<name>_us` twin, tool arguments as JSON in `args_json`) are still
read: they are converted to the record's fields, as those releases read them. A document that
cannot be converted is handed to the engine as it is, so reading it fails as damage of that one
record instead of disappearing.

Message nodes are one document per message (`run_id`, `n`, `parent`, `body` as binary); a body
larger than `NODE_PIECE_BYTES` continues in documents with the same `n` and `part` 1, 2, ...

A run's lease is one document in `run_leases` (`_id` = run id): `epoch`, `state`, `host`, `body`
(the engine's JSON, a string), `expires` (a BSON date on the server's clock), the start point in
`start` (binary, absent when none was stored) and `fenced_writes`, a count of the fenced write
transactions that went through it (see `store.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, cast

from bson.binary import Binary

from stepcore.backend import ops

from .client import Document

__all__ = (
    'NODE_PIECE_BYTES',
    'effect_document',
    'effect_row',
    'event_document',
    'event_row',
    'from_millis',
    'lease_fields',
    'lease_row',
    'micros',
    'millis',
    'node_documents',
    'nodes_from',
    'run_document',
    'run_row',
    'snapshot_document',
    'snapshot_row',
)

NODE_PIECE_BYTES: Final = 8 * 1024 * 1024
"""Largest message body slice held by one node document (MongoDB caps a document at 16 MiB)."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
_MILLISECOND: Final = timedelta(milliseconds=1)
_CONVERSION_ERRORS = (KeyError, TypeError, ValueError, OverflowError)


def micros(moment: datetime) -> int:
    """Microseconds since the epoch: BSON dates hold milliseconds, this twin keeps the exact instant."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return (aware - _EPOCH) // _MICROSECOND


def millis(moment: datetime) -> int:
    """Milliseconds since the epoch (a BSON date's precision); a naive time is taken as UTC."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return (aware - _EPOCH) // _MILLISECOND


def from_millis(value: int) -> datetime:
    """The UTC time `value` milliseconds after the epoch."""
    return _EPOCH + timedelta(milliseconds=value)


def _put_time(doc: Document, name: str, moment: datetime) -> None:
    doc[name] = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    doc[f'{name}_us'] = micros(moment)


def _time(doc: Mapping[str, Any], name: str) -> datetime:
    """A document's time field, exact from its `_us` twin when there is one (only for ordering)."""
    exact = doc.get(f'{name}_us')
    if isinstance(exact, int) and not isinstance(exact, bool):
        try:
            return _EPOCH + timedelta(microseconds=exact)
        except OverflowError:
            pass
    value = doc.get(name)
    return value if isinstance(value, datetime) else _EPOCH


def _text(body: ops.Body) -> str:
    return body.decode() if isinstance(body, bytes) else cast(str, body)


def _body(doc: Document, legacy: Iterable[str] = ()) -> ops.Body:
    """The record body of a document: its `body` field as stored, else its fields converted the way
    documents written before bodies were read (`legacy`: its time fields).

    A document that does not convert becomes a body whose reading fails with the reason: handed
    over as it is, it could validate with a field quietly lost (tool arguments, say).
    """
    if 'body' in doc:
        return cast(ops.Body, doc['body'])
    data = {k: v for k, v in doc.items() if k != '_id'}
    try:
        for name in legacy:
            data[name] = _EPOCH + timedelta(microseconds=cast(int, data.pop(f'{name}_us')))
        if 'args_json' in data:
            data['args'] = json.loads(cast(str, data.pop('args_json')))
    except _CONVERSION_ERRORS as error:
        return ops.Unparsable(
            f'its document (written before record bodies) does not convert: {type(error).__name__}: {error}'
        )
    return data


def _optional(doc: Document, name: str) -> Any:
    value = doc.get(name)
    return value if isinstance(value, str) else None


# -- runs -------------------------------------------------------------------------------------


def run_document(row: ops.RunRow) -> Document:
    doc: Document = {'_id': row.run_id}
    # absent rather than null, so the sparse lineage indexes hold only runs that have the field
    if row.conversation_id is not None:
        doc['conversation_id'] = row.conversation_id
    if row.parent_run_id is not None:
        doc['parent_run_id'] = row.parent_run_id
    _put_time(doc, 'started_at', row.started_at)
    doc['body'] = _text(row.body)
    return doc


def run_row(doc: Document) -> ops.RunRow:
    return ops.RunRow(
        run_id=cast(str, doc['_id']),
        started_at=_time(doc, 'started_at'),
        conversation_id=_optional(doc, 'conversation_id'),
        parent_run_id=_optional(doc, 'parent_run_id'),
        body=_body(doc, ('started_at',)),
    )


# -- events and ledger ------------------------------------------------------------------------


def event_document(run_id: str, row: ops.EventRow, seq: int) -> Document:
    doc: Document = {'run_id': run_id, 'seq': seq}
    if row.idempotency_key is not None:
        doc['idempotency_key'] = row.idempotency_key
    doc['body'] = _text(row.body)
    return doc


def event_row(doc: Document) -> ops.EventRow:
    seq = doc.get('seq')
    return ops.EventRow(
        run_id=cast(str, doc['run_id']),
        idempotency_key=_optional(doc, 'idempotency_key'),
        body=_body(doc, ('timestamp',)),
        seq=seq if isinstance(seq, int) else None,
    )


def effect_document(row: ops.EffectRow) -> Document:
    doc: Document = {'run_id': row.run_id, 'tool_call_id': row.tool_call_id, 'status': row.status}
    _put_time(doc, 'started_at', row.started_at)
    doc['body'] = _text(row.body)
    return doc


def effect_row(doc: Document) -> ops.EffectRow:
    # tool_call_id and status go back into the record from these fields: a bad one fails its validation
    return ops.EffectRow(
        run_id=cast(str, doc['run_id']),
        tool_call_id=cast(str, doc.get('tool_call_id')),
        status=cast(str, doc.get('status')),
        started_at=_time(doc, 'started_at'),
        body=_body(doc, ('started_at', 'updated_at')),
    )


# -- snapshots and message nodes --------------------------------------------------------------


def snapshot_document(run_id: str, row: ops.SnapshotRow, *, key: str | None, seq: int, head: int | None) -> Document:
    doc: Document = {'run_id': run_id, 'seq': seq, 'state': row.state, 'head': head, 'length': row.length}
    if key is not None:
        doc['idempotency_key'] = key  # for the unique index; the body holds it too
    doc['body'] = _text(row.body)
    return doc


def snapshot_row(doc: Document) -> ops.SnapshotRow:
    seq, head, length = doc.get('seq'), doc.get('head'), doc.get('length')
    body = _body(doc, ('created_at',))
    if not (head is None or type(head) is int) or type(length) is not int or length < 0:
        # the chain cannot be followed: the snapshot reads as damaged instead of as a shorter history
        body = ops.Unparsable(f'its document has head={head!r} and length={length!r}: expected a node id and a count')
        head, length = None, 0
    if isinstance(body, dict):  # converted from a document written before bodies
        body = {k: v for k, v in body.items() if k not in ('head', 'length')}
    return ops.SnapshotRow(
        run_id=cast(str, doc['run_id']),
        state=cast(str, doc.get('state')),
        head=head,
        length=length,
        body=body,
        seq=seq if isinstance(seq, int) else None,
    )


def node_documents(run_id: str, ids: Sequence[int], parent: int | None, bodies: Sequence[bytes]) -> list[Document]:
    """The documents of new message nodes, each chained to the one before (the first to `parent`)."""
    docs: list[Document] = []
    for node, body in zip(ids, bodies, strict=True):
        pieces = [body[i : i + NODE_PIECE_BYTES] for i in range(0, len(body), NODE_PIECE_BYTES)] or [b'']
        docs.append(
            {'run_id': run_id, 'n': node, 'part': 0, 'parent': parent, 'parts': len(pieces), 'body': Binary(pieces[0])}
        )
        docs.extend(
            {'run_id': run_id, 'n': node, 'part': i, 'body': Binary(piece)}
            for i, piece in enumerate(pieces[1:], start=1)
        )
        parent = node
    return docs


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return bytes(value)
    return value.encode() if isinstance(value, str) else repr(value).encode()


def nodes_from(docs: Iterable[Document]) -> dict[int, ops.Node]:
    """Nodes (`{n: (parent, body)}`) from their documents, continuation parts joined.

    A node missing continuation parts keeps the parts there are: decoding it fails, and the engine
    names the damaged message.
    """
    heads: dict[int, Document] = {}
    extra: dict[int, dict[int, bytes]] = {}
    for doc in docs:
        node, part = doc.get('n'), doc.get('part', 0)
        if type(node) is not int or type(part) is not int:
            continue  # not addressable as a node: a chain that needs it reads as broken
        if part == 0:
            heads[node] = doc
        else:
            extra.setdefault(node, {})[part] = _bytes(doc.get('body'))
    nodes: dict[int, ops.Node] = {}
    for node, doc in heads.items():
        body = _bytes(doc.get('body'))
        parts = doc.get('parts', 1)
        if type(parts) is int and parts > 1:
            rest = extra.get(node, {})
            body += b''.join(rest[i] for i in range(1, parts) if i in rest)
        parent = doc.get('parent')
        nodes[node] = (parent if type(parent) is int else None, body)
    return nodes


# -- leases -----------------------------------------------------------------------------------


def lease_fields(row: ops.LeaseRow) -> Document:
    """A lease's fields other than `_id`, `expires` and `start` (which the store sets itself)."""
    return {'epoch': row.epoch, 'state': row.state, 'host': row.host, 'body': _text(row.body)}


def lease_row(doc: Mapping[str, Any]) -> ops.LeaseRow:
    """A lease document as the engine's row; `expires` in seconds since the epoch.

    A document with a field of the wrong type gets an empty body, which the engine's decoding
    refuses: the lease reads as damaged rather than failing here.
    """
    epoch, state, host, expires, body = (doc.get(k) for k in ('epoch', 'state', 'host', 'expires', 'body'))
    sound = type(epoch) is int and isinstance(state, str) and isinstance(host, str) and isinstance(expires, datetime)
    return ops.LeaseRow(
        run_id=cast(str, doc['_id']),
        epoch=epoch if type(epoch) is int else 0,
        state=state if isinstance(state, str) else '',
        host=host if isinstance(host, str) else '',
        expires=millis(expires) / 1000 if isinstance(expires, datetime) else 0.0,
        body=body if sound and isinstance(body, str | bytes) else '',
    )
