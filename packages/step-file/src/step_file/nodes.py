"""The message-node log (`messages.jsonl`): one line per stored message.

A line is either a full node::

    {"id":7,"parent":6,"body":{...the stored message...}}

or a *restamp* of an earlier full node with the same parent::

    {"id":9,"parent":6,"base":7,"set":{"timestamp":...,"run_id":...}}

pydantic-ai stamps a request (its timestamp, run id, conversation id) after it was saved as the
newest message of a snapshot, so the next snapshot holds the same request with a few top-level
fields changed. Storing that message again in full would double the bytes of every tool return;
a restamp line stores only the changed fields. Its body is the base node's body with `set`
applied on top. A base is always a full node, so resolving never chains.

Node ids are given in line order (each line's id is one more than the last), so a node id at or
past the number of lines is one whose line never reached the file.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

__all__ = ('NodeWriter', 'Nodes', 'node_id_of', 'parse_nodes')

logger = logging.getLogger('step_file')

_HEAD = re.compile(rb'\{"id":(\d+),"parent":(null|\d+),')
_FULL = re.compile(rb'\{"id":(\d+),"parent":(null|\d+),"body":')
_RESTAMP = re.compile(rb'\{"id":(\d+),"parent":(null|\d+),"base":(\d+),"set":')
_RESTAMP_MIN_BYTES = 512
"""Bodies smaller than this are always stored in full: a restamp would save too little."""
_MAX_REMEMBERED = 64

Nodes = dict[int, tuple[int | None, bytes]]


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(',', ':'), ensure_ascii=False).encode()


def _object(raw: bytes) -> dict[str, Any] | None:
    try:
        value: Any = json.loads(raw)
    except ValueError:
        return None
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


def node_id_of(line: bytes) -> int | None:
    """The id of a node line, `None` when even that cannot be read."""
    match = _HEAD.match(line)
    return int(match.group(1)) if match is not None else None


def _parent(raw: bytes) -> int | None:
    return None if raw == b'null' else int(raw)


def _warn_unplaced(number: int, path: Path, line: bytes) -> None:
    logger.warning('step_file: line %d of %s is damaged and names no node id: %r', number, path, line[:200])


def parse_nodes(lines: Sequence[bytes], path: Path) -> tuple[Nodes, int]:
    """`{id: (parent, body)}` for every node line, and the end of the node ids (see the module docstring).

    A damaged line whose id and parent can be read is handed over with the raw line as its body
    (and so is a restamp whose base is missing or damaged), so reading it fails as damage of that
    one message; a line without even an id is logged.
    """
    nodes: Nodes = {}
    restamps: list[tuple[int, int | None, int, bytes, bytes]] = []
    for number, line in enumerate(lines, 1):
        complete = line.endswith(b'}')
        match = _FULL.match(line) if complete else None
        if match is not None:
            nodes[int(match.group(1))] = (_parent(match.group(2)), line[match.end() : -1])
            continue
        restamp = _RESTAMP.match(line) if complete else None
        if restamp is not None:
            node_id, parent, base = int(restamp.group(1)), _parent(restamp.group(2)), int(restamp.group(3))
            restamps.append((node_id, parent, base, line[restamp.end() : -1], line))
            continue
        head = _HEAD.match(line)
        if head is not None:
            nodes[int(head.group(1))] = (_parent(head.group(2)), line)
        else:
            _warn_unplaced(number, path, line)
    for node_id, parent, base_id, changes, line in restamps:
        base = nodes.get(base_id)
        base_body = _object(base[1]) if base is not None else None
        update = _object(changes)
        nodes[node_id] = (parent, line if base_body is None or update is None else _dumps(base_body | update))
    # A damaged newline merges the last two lines: the ids in the last line still count, so the
    # newest node is not taken for one that never reached the file.
    end = max(len(lines), max(nodes, default=-1) + 1)
    last = node_id_of(lines[-1]) if lines else None
    if last is not None and re.search(rb'\}.\{"id":%d,"parent":' % (last + 1), lines[-1], re.DOTALL):
        end = max(end, last + 2)
    return nodes, end


@dataclass(slots=True)
class _Full:
    node_id: int
    body: bytes
    parsed: dict[str, Any] | None = None


@dataclass(slots=True)
class NodeWriter:
    """What a process keeps of one run's `messages.jsonl` (the fold of its `Log`): where the next
    node id starts, and recent full nodes by parent, to restamp them."""

    path: Path
    start: int | None = None
    """The id of the file's first node; the ids of its lines follow on from it, one per line."""
    end: int = 0
    """One past the newest node id in the file."""
    _by_parent: dict[int | None, _Full] = field(default_factory=dict[int | None, _Full])

    def add(self, number: int, line: bytes) -> None:
        node_id = node_id_of(line)
        if node_id is None:
            _warn_unplaced(number, self.path, line)
        elif self.start is None:
            self.start = node_id - number + 1  # `number` counts lines from 1
        self.end = max(self.end, (self.start or 0) + number, -1 if node_id is None else node_id + 1)

    def holds(self, node: int) -> bool:
        """Whether `node` is one of this file's nodes."""
        return self.start is not None and self.start <= node < self.end

    def _first_id(self) -> int:
        """The next node's id. A new file starts from the clock, in microseconds: a run folder that was
        deleted and made again never hands out the ids of the one before, which another process may
        still remember."""
        if self.start is None:
            self.start = self.end = time.time_ns() // 1000
        return self.end

    def encode(
        self, parent: int | None, bodies: Sequence[bytes]
    ) -> tuple[bytes, list[int], list[tuple[int | None, _Full]]]:
        """The log lines for `bodies` chained from `parent`, the ids they get, and what to `commit`.

        Call `commit` with the third value once the lines are written: a restamp may only name
        a base that is in the file.
        """
        written: list[tuple[int | None, _Full]] = []
        chunks: list[bytes] = []
        ids: list[int] = []
        node_id = self._first_id()
        previous = parent
        for index, body in enumerate(bodies):
            if b'\n' in body:  # compact JSON never holds one, but a line must stay one line
                body = _dumps(json.loads(body))
            parent_text = b'null' if previous is None else b'%d' % previous
            restamp = self._restamp(previous, body) if index == 0 else None
            if restamp is not None:
                base_id, changes = restamp
                chunks.append(b'{"id":%d,"parent":%s,"base":%d,"set":%s}\n' % (node_id, parent_text, base_id, changes))
            else:
                chunks.append(b'{"id":%d,"parent":%s,"body":%s}\n' % (node_id, parent_text, body))
                written.append((previous, _Full(node_id, body)))
            ids.append(node_id)
            previous = node_id
            node_id += 1
        return b''.join(chunks), ids, written

    def commit(self, written: Sequence[tuple[int | None, _Full]]) -> None:
        """Remember full nodes now in the file, as restamp bases for their parent's next child."""
        for parent, node in written:
            if len(self._by_parent) >= _MAX_REMEMBERED:
                self._by_parent.clear()
            self._by_parent[parent] = node

    def _restamp(self, parent: int | None, body: bytes) -> tuple[int, bytes] | None:
        """`(base id, changed fields)` when `body` is an earlier sibling with only top-level fields changed."""
        base = self._by_parent.get(parent)
        if base is None or len(body) < _RESTAMP_MIN_BYTES or len(base.body) < _RESTAMP_MIN_BYTES:
            return None
        if base.parsed is None:
            base.parsed = _object(base.body)
        new = _object(body)
        if base.parsed is None or new is None or not base.parsed.keys() <= new.keys():
            return None
        if new.get('kind') != base.parsed.get('kind') or new.get('parts') != base.parsed.get('parts'):
            return None
        changes = _dumps({k: v for k, v in new.items() if k not in base.parsed or base.parsed[k] != v})
        if len(changes) * 2 > len(body):
            return None
        return base.node_id, changes
