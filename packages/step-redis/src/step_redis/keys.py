"""Key names and value layouts: where step-redis keeps what, under one key prefix.

Every key is `<prefix>:<kind>` or `<prefix>:<kind>:<id>`. The prefix has no `:` and no kind
has one, so a key names exactly one thing even when ids contain `:`; several applications share
one server by using different prefixes.

| key | type | holds |
|---|---|---|
| `<p>:identity` | string | the store's id (`stepcore.backend.ops.StoreIdentity`), set once |
| `<p>:runs` | hash | run id -> run row |
| `<p>:runorder` | sorted set | run ids, scored by insertion order (`<p>:runseq` counts) |
| `<p>:conv:<conversation id>`, `<p>:parent:<run id>` | sorted set | the runs of a conversation, of a parent |
| `<p>:nodeids` | counter | message node ids, handed out in blocks and never reused |
| `<p>:ev:<run>` | list | events, in seq order (seq = position + 1) |
| `<p>:evkeys:<run>` | set | event idempotency keys applied |
| `<p>:fx:<run>` | hash | tool call id -> ledger row |
| `<p>:fxorder:<run>` | list | tool call ids, in the order first recorded |
| `<p>:snap:<run>` | hash | snapshot seq -> snapshot row |
| `<p>:snapstate:<run>` | hash | snapshot seq -> state |
| `<p>:snapseq:<run>`, `<p>:snapdone:<run>` | sorted set | every snapshot seq, the complete ones |
| `<p>:snapkeys:<run>` | set | snapshot idempotency keys applied (kept when snapshots are pruned) |
| `<p>:snapcount:<run>` | counter | the run's last snapshot seq |
| `<p>:node:<run>` | hash | message node id -> node row |
| `<p>:lease:<run>` | hash | the run's lease: `epoch`, `state`, `host`, `expires`, `body` |
| `<p>:leasestart:<run>` | string | the start point stored with the lease |
| `<p>:leases:<state>` | sorted set | the run ids whose lease is in a live state (never `ended`), scored by `expires` |
| `<p>:media:<sha256>`, `<p>:mediameta:<sha256>` | string | a blob, its metadata (JSON) |
| `<p>:mediatime` | sorted set | blob digests, scored by when each was last put (microseconds since the epoch) |

A row is its fields joined by NUL bytes, the engine's encoded body last (ids, keys and states
never hold NUL; a body may hold anything, since it is the rest of the value). A lease is a hash
instead, so the scripts read and compare its epoch and expiry; every time in it (`expires`, and
the scores of `<p>:leases:<state>`) is whole microseconds since the Unix epoch on the server's clock.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final, NamedTuple

__all__ = ('DEFAULT_KEY_PREFIX', 'EPOCH', 'Keys', 'RunKeys', 'check_key_prefix', 'moment', 'pack', 'text', 'unpack')

DEFAULT_KEY_PREFIX: Final = 'stepcore'
_PREFIX = re.compile(r'[A-Za-z0-9_.-]{1,64}')
SEP: Final = b'\x00'
EPOCH: Final = datetime.fromtimestamp(0, UTC)


def check_key_prefix(prefix: object) -> str:
    """`prefix` when usable as a key prefix; `ValueError` saying what to use otherwise."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f'key_prefix={prefix!r} cannot be used: use 1-64 of A-Z a-z 0-9 _ . - (no ":", which separates the '
            'parts of a key)'
        )
    return prefix


class RunKeys(NamedTuple):
    """The keys of one run, in the order the Lua scripts index them (`KEYS[base + 1]` is `ev`)."""

    ev: bytes
    evkeys: bytes
    fx: bytes
    fxorder: bytes
    snap: bytes
    snapstate: bytes
    snapseq: bytes
    snapdone: bytes
    snapkeys: bytes
    snapcount: bytes
    node: bytes
    lease: bytes
    leasestart: bytes
    writes: bytes
    """The ids of the run's recent commits (a sorted set by time): see `scripts.COMMIT`."""


class Keys:
    """The key names of one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = check_key_prefix(prefix)
        self.runs = self._key('runs')
        self.runorder = self._key('runorder')
        self.runseq = self._key('runseq')
        self.nodeids = self._key('nodeids')
        self.media_times = self._key('mediatime')
        self.identity = self._key('identity')

    def _key(self, kind: str, ident: str | None = None) -> bytes:
        name = f'{self.prefix}:{kind}'
        return (name if ident is None else f'{name}:{ident}').encode()

    def conversation(self, conversation_id: str) -> bytes:
        return self._key('conv', conversation_id)

    def parent(self, parent_run_id: str) -> bytes:
        return self._key('parent', parent_run_id)

    def run(self, run_id: str) -> RunKeys:
        return RunKeys(*(self._key(kind, run_id) for kind in RunKeys._fields))

    def leases(self, state: str) -> bytes:
        """The index of the runs whose lease is in `state` (a live one: `ended` has none)."""
        return self._key('leases', state)

    def media(self, digest: str) -> bytes:
        return self._key('media', digest)

    def media_meta(self, digest: str) -> bytes:
        return self._key('mediameta', digest)


def pack(*fields: str | bytes | None) -> bytes:
    """A row: the fields joined by NUL (`None` as empty), the last one (the body) taken as it is."""
    return SEP.join(b'' if f is None else f.encode() if isinstance(f, str) else f for f in fields)


def unpack(value: bytes, count: int) -> list[bytes]:
    """The `count` fields of a row; `ValueError` when it has fewer."""
    fields = value.split(SEP, count - 1)
    if len(fields) != count:
        raise ValueError(f'the stored row has {len(fields)} of its {count} NUL-separated fields')
    return fields


def text(field: bytes) -> str | None:
    """A text field of a row (`None` when empty)."""
    return field.decode() if field else None


def moment(field: bytes) -> datetime:
    """A time field of a row (ISO 8601)."""
    return datetime.fromisoformat(field.decode())
