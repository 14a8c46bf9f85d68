"""Incremental history storage, shared by every persistent store.

A run's messages are stored as nodes of a tree: each node holds one encoded message and points at
the node before it. A snapshot names only its newest node (its *head*) and its length, so saving a
step writes the messages that are new since the previous save and one small snapshot row, and
reading a snapshot walks back from its head. Bytes grow linearly with the run and the work per save
does not grow with the history.

History rewrites are handled by content: the new history is compared with the last saved one, the
longest common prefix is reused, and everything after it becomes new nodes hanging off the prefix.
So a compaction, a trimming history processor, or a request stamped by pydantic-ai after it was
saved (its timestamp and run id are filled in when it is sent) are all stored exactly.

Comparing content without re-serializing the whole history at every step: the index remembers,
per run, the message objects it saved and a digest of each one's encoding. A position holding the
very same object (or, when the whole prefix compares equal, an equal one) is taken as unchanged,
except for the newest `TAIL_RECHECK` saved messages, which pydantic-ai is known to stamp in place
and which are always re-encoded and compared. Everything else is re-encoded and compared by
digest. A message replaced by an equal one (`==`: the same fields) therefore keeps its stored form;
only an equal value that encodes differently (a dict with its keys in another order, `1.0` for
`1`) would be restored as it was first saved. Messages older than the tail are
assumed not to be mutated in place (pydantic-ai never does so); a rewrite that replaces them is
detected by identity.

The remembered objects are a list of the index's own, extended in place at each save, and a
history that only grew is recognized by one comparison of two lists of pointers (`shares_prefix`):
no copy or slice of the history is made per save, so the messages already saved are not touched
(not even their reference counts) and a save's cost stays flat as the run grows.

Nodes are never deleted while their run exists, so pruning a snapshot cannot break another one,
and an index entry can never point at a node that is gone.

Every persistent store saves through the engine (`EngineStore`), whose driver calls `diff` in the
same call that writes the snapshot: for a `SyncPort`, on the port's thread in one hand-off with the
commit (or inline on the event loop for a short write), so encoding, most of a save's CPU, runs
beside the store's other work instead of on the loop. A diff whose new messages hold media or
reserved keys (`walked` is False) goes back to the loop for `walk`, which may call the media store,
before it is written; once written, `commit` remembers it with its new nodes' ids.
"""

from __future__ import annotations

import hashlib
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from itertools import islice

from pydantic_ai.messages import ModelMessage

from stepcore.media.walker import MediaWalker
from stepcore.store.codec import decode_messages, encode_message

__all__ = (
    'REFRESH_WINDOW',
    'TAIL_RECHECK',
    'HistoryDelta',
    'HistoryIndex',
    'shares_prefix',
    'starts_with',
    'trusted_prefix',
    'walk_chain',
)

TAIL_RECHECK = 2
"""How many of the newest saved messages are always re-encoded when compared."""

REFRESH_WINDOW = 256
"""How many positions of the shared prefix each save re-points at the objects it was given."""

NodeId = Hashable


def starts_with(messages: Sequence[ModelMessage], prefix: Sequence[ModelMessage]) -> bool:
    """Whether `messages` begins with the messages of `prefix`: the very objects, or equal ones.

    One list comparison, which CPython runs at C speed and which takes an identical object as
    equal without calling its `__eq__`, so a long history that only grew costs almost nothing.
    When a value refuses `==` (a tool return holding an array), the objects are compared by
    identity instead.
    """
    if len(messages) < len(prefix):
        return False
    head = messages[: len(prefix)]
    try:
        return (head if isinstance(head, list) else list(head)) == (
            prefix if isinstance(prefix, list) else list(prefix)
        )
    except Exception:  # a value whose `==` refuses: compare by identity
        return all(map(operator.is_, head, prefix))


def shares_prefix(owned: list[ModelMessage], messages: list[ModelMessage], n: int) -> bool:
    """Whether the first `n` items of `messages` are those of `owned`: the very objects, or equal ones.

    `starts_with` without its slices: `owned` (a list nobody else reads meanwhile) is cut to `n`
    items and lent the rest of `messages` for one comparison of two lists of the same length,
    then restored. Comparing a position that holds the very same object reads only the two
    lists' pointers, so a long history that only grew is checked without touching its messages;
    slicing it would touch every one (their reference counts), which is what made the work per
    save grow with the run. Needs `n <= len(owned)` and `n <= len(messages)`.
    """
    rest = owned[n:]
    del owned[n:]
    owned.extend(messages[n:])
    try:
        return owned == messages
    except Exception:  # a value whose `==` refuses: compare by identity
        return all(map(operator.is_, islice(owned, n), messages))
    finally:
        del owned[n:]
        owned.extend(rest)


def trusted_prefix(messages: Sequence[ModelMessage], saved: list[ModelMessage], *, owned: bool = False) -> int:
    """How many leading `messages` can be taken as the saved ones without re-encoding them: those
    that are the very objects of `saved` (or equal to them), short of its newest `TAIL_RECHECK`.

    A history that only grew, the usual case, is recognized in one comparison (`shares_prefix`
    when `saved` is `owned`, a list only the caller uses, else `starts_with`). When that fails (a
    message was replaced), the prefix of identical objects is found one by one. A message replaced
    by an equal one keeps its stored form (see the module docstring).
    """
    limit = max(0, min(len(messages), len(saved) - TAIL_RECHECK))
    if not limit:
        return 0
    if owned and isinstance(messages, list):
        if shares_prefix(saved, messages, limit):
            return limit
    elif starts_with(messages, saved[:limit]):
        return limit
    flags = list(map(operator.is_, islice(messages, limit), saved))
    return flags.index(False) if False in flags else limit


def _digest(encoded: bytes) -> bytes:
    return hashlib.blake2b(encoded, digest_size=16).digest()


@dataclass(slots=True)
class _SavedHistory:
    messages: list[ModelMessage]
    """The saved message objects: a list of the index's own, extended in place at each save."""
    digests: list[bytes]
    nodes: list[NodeId]
    sums: list[str] = field(default_factory=list[str])
    """The stored sum of each node (see `stepcore.engine._seal`), when the store seals its nodes."""
    version: int = 0
    """Counts the commits applied to this entry in place; a delta diffed against an older version
    cannot be applied in place (its prefix may have changed since)."""
    refreshed: int = 0
    """Where the next commit starts re-pointing the shared prefix at the given objects (`_refresh`)."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Held while the entry is compared (`diff`, on a store's thread) or extended (`commit`)."""


@dataclass(slots=True)
class HistoryDelta:
    """What a save must write: the messages after the reused prefix, in stored form."""

    run_id: str
    parent: NodeId | None
    """The node the first new message hangs off (`None` when the history starts fresh)."""
    shared: int
    """How many leading messages are reused from the previous save."""
    new_messages: list[bytes]
    """`messages[shared:]`, encoded, in order; in stored form (media externalized) once `walked`."""
    total: int
    """Length of the whole history."""
    walked: bool
    """Whether `new_messages` are in stored form; a delta from `diff` may still need `walk`."""
    parent_sum: str | None = None
    """The stored sum of the `parent` node (`None`: no parent, or its sum is not remembered)."""
    _messages: list[ModelMessage] = field(default_factory=list[ModelMessage], repr=False)
    _new_digests: list[bytes] = field(default_factory=list[bytes], repr=False)
    """Digests of the messages after `shared`."""
    _base: _SavedHistory | None = field(default=None, repr=False)
    _base_version: int = field(default=0, repr=False)
    _trusted: int = field(default=0, repr=False)
    """How many leading messages were taken as saved without re-encoding them."""


class HistoryIndex:
    """Per-store memory of the last saved history of recent runs."""

    def __init__(self, walker: MediaWalker, *, max_runs: int = 256) -> None:
        self.walker = walker
        self.max_runs = max_runs
        self._runs: OrderedDict[str, _SavedHistory] = OrderedDict()

    def diff(self, run_id: str, messages: Sequence[ModelMessage]) -> HistoryDelta:
        """Compare `messages` with the run's last saved history and encode what is new; callable from
        any thread (the media walk is left to `walk`).

        `messages` must not change until the delta is committed; the index does not keep it. When
        the result's `walked` is False, `await walk(delta)` on the event loop before writing it.
        """
        saved = self._runs.get(run_id)
        messages = messages if isinstance(messages, list) else list(messages)
        digests: list[bytes] = []
        trusted = 0
        shared = 0
        pending: list[bytes] = []
        parent: NodeId | None = None
        parent_sum: str | None = None
        version = 0
        if saved is not None:
            with saved.lock:  # `commit` may be extending it on another thread
                version = saved.version
                limit = min(len(messages), len(saved.messages))
                # Positions below the re-checked tail holding the very object that was saved are
                # taken as unchanged without re-encoding.
                shared = trusted = trusted_prefix(messages, saved.messages, owned=True)
                while shared < limit:
                    encoded = encode_message(messages[shared])
                    digest = _digest(encoded)
                    if digest != saved.digests[shared]:
                        pending.append(encoded)
                        digests.append(digest)
                        break
                    shared += 1
                if shared:
                    parent = saved.nodes[shared - 1]
                    parent_sum = saved.sums[shared - 1] if len(saved.sums) >= shared else None
        start = shared + 1 if pending else shared
        for message in messages[start:]:
            encoded = encode_message(message)
            pending.append(encoded)
            digests.append(_digest(encoded))
        return HistoryDelta(
            run_id=run_id,
            parent=parent,
            shared=shared,
            new_messages=pending,
            total=len(messages),
            walked=not self.walker.any_needs_walk(pending),
            parent_sum=parent_sum,
            _messages=messages,
            _new_digests=digests,
            _base=saved,
            _base_version=version,
            _trusted=trusted,
        )

    async def walk(self, delta: HistoryDelta) -> None:
        """Put a delta's new messages in stored form (media externalized, reserved keys escaped)."""
        if not delta.walked:
            delta.new_messages = [await self.walker.externalize(e) for e in delta.new_messages]
            delta.walked = True

    def commit(self, delta: HistoryDelta, new_nodes: Sequence[NodeId], sums: Sequence[str] = ()) -> None:
        """Remember a written delta; `new_nodes` are the ids given to `delta.new_messages`, `sums`
        (when the store seals its nodes) their stored sums."""
        if len(new_nodes) != len(delta.new_messages):
            raise ValueError(f'commit got {len(new_nodes)} node ids for {len(delta.new_messages)} new messages')
        base, shared = delta._base, delta.shared
        keeps_sums = bool(sums) and (shared == 0 or (base is not None and len(base.sums) >= shared))
        if base is not None and self._runs.get(delta.run_id) is base:
            with base.lock:
                if base.version == delta._base_version:
                    # The usual case, a history that grew: the remembered lists are cut back to
                    # the shared prefix and extended in place, so a save costs nothing per message
                    # already saved. Positions re-encoded and found unchanged take the given
                    # objects at once; those taken without re-encoding, a window per save.
                    base.messages[delta._trusted : shared] = delta._messages[delta._trusted : shared]
                    _refresh(base, delta._messages, delta._trusted)
                    del base.messages[shared:], base.digests[shared:], base.nodes[shared:]
                    base.messages.extend(delta._messages[shared:])
                    base.digests.extend(delta._new_digests)
                    base.nodes.extend(new_nodes)
                    if keeps_sums:
                        del base.sums[shared:]
                        base.sums.extend(sums)
                    else:
                        base.sums.clear()
                    base.version += 1
                    self._runs.move_to_end(delta.run_id)
                    return
        if base is not None and base.version != delta._base_version:
            # Another save of the run was committed since this one was diffed: what this one
            # shares with it is no longer known, so nothing is remembered (the next save writes
            # its history whole).
            self.forget(delta.run_id)
            return
        self._runs[delta.run_id] = _SavedHistory(
            messages=list(delta._messages),
            digests=[*(base.digests[:shared] if base else []), *delta._new_digests],
            nodes=[*(base.nodes[:shared] if base else []), *new_nodes],
            sums=[*(base.sums[:shared] if base else []), *sums] if keeps_sums else [],
        )
        self._runs.move_to_end(delta.run_id)
        while len(self._runs) > self.max_runs:
            self._runs.popitem(last=False)

    def saved_length(self, run_id: str) -> int:
        """How many messages of the run's last saved history are remembered (0: none)."""
        saved = self._runs.get(run_id)
        return 0 if saved is None else len(saved.messages)

    def forget(self, run_id: str) -> None:
        """Drop what is remembered of a run (call when its nodes are deleted)."""
        self._runs.pop(run_id, None)

    async def decode(self, stored: Sequence[bytes]) -> list[ModelMessage]:
        """Messages back from stored node bodies, oldest first, media restored."""
        return decode_messages([await self.walker.restore(s) for s in stored])


def _refresh(saved: _SavedHistory, messages: list[ModelMessage], shared: int) -> None:
    """Take the objects of `messages` for the next `REFRESH_WINDOW` positions of the shared prefix.

    The remembered list keeps the objects it holds where a save's are the same or equal (the
    comparison in `trusted_prefix` accepts both). Where a history's messages were replaced by equal
    copies, every later save would compare those copies field by field; going round the prefix a
    window at a time, the remembered objects become the current ones within `shared /
    REFRESH_WINDOW` saves, at a bounded cost per save.
    """
    if not shared:
        return
    start = saved.refreshed if saved.refreshed < shared else 0
    stop = min(start + REFRESH_WINDOW, shared)
    saved.messages[start:stop] = messages[start:stop]
    saved.refreshed = stop


def walk_chain(
    head: NodeId | None, length: int, lookup: Callable[[NodeId], tuple[NodeId | None, bytes]]
) -> list[bytes]:
    """Stored bodies of the `length` nodes ending at `head`, oldest first.

    `lookup(node)` returns `(parent, body)`. Raises `LookupError` when the chain is shorter than
    the snapshot says, which means the store lost nodes.
    """
    bodies: list[bytes] = []
    node = head
    while node is not None and len(bodies) < length:
        parent, body = lookup(node)
        bodies.append(body)
        node = parent
    if len(bodies) != length:
        raise LookupError(f'stored history is broken: expected {length} messages, found {len(bodies)}')
    bodies.reverse()
    return bodies
