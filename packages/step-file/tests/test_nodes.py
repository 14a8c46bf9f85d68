"""The message-node log format: full nodes and restamps."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from step_file.nodes import NodeWriter, node_id_of, parse_nodes

LOG = Path('messages.jsonl')


def body(**fields: object) -> bytes:
    message = {'parts': [{'part_kind': 'tool-return', 'content': 'x' * 900}], 'kind': 'request'} | fields
    return json.dumps(message, separators=(',', ':')).encode()


def test_restamp_of_a_sibling_stores_only_changed_fields() -> None:
    writer = NodeWriter()
    first, ids, written = writer.encode(0, None, [body(timestamp=None)])
    writer.commit(written)
    assert ids == [0]
    # The same request, stamped later, saved again under the same parent.
    second, ids, written = writer.encode(1, None, [body(timestamp='2026-01-01T00:00:00Z', run_id='r')])
    writer.commit(written)
    assert ids == [1]
    line = json.loads(second)
    assert (line['base'], line['set']) == (0, {'timestamp': '2026-01-01T00:00:00Z', 'run_id': 'r'})
    assert len(second) < len(first) // 4

    nodes = parse_nodes([*first.splitlines(), *second.splitlines()], LOG)
    assert json.loads(nodes[1][1]) == json.loads(body(timestamp='2026-01-01T00:00:00Z', run_id='r'))
    assert [node_id_of(x) for x in (*first.splitlines(), *second.splitlines())] == [0, 1]


def test_different_parts_or_uncommitted_bases_are_stored_in_full() -> None:
    writer = NodeWriter()
    _, _, written = writer.encode(0, None, [body()])
    # Not committed (the write failed): it must not be used as a base.
    data, _, _ = writer.encode(1, None, [body(run_id='r')])
    assert b'"body":' in data
    writer.commit(written)
    other = json.dumps({'parts': [{'content': 'y' * 900}], 'kind': 'request'}).encode()
    data, _, _ = writer.encode(1, None, [other])
    assert b'"body":' in data
    # Only the first new message of a save can have a sibling.
    data, _, _ = writer.encode(1, 5, [body(), body(run_id='r')])
    assert data.count(b'"body":') == 2


def test_restamp_with_a_missing_base_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    lines = [b'{"id":3,"parent":2,"base":1,"set":{"run_id":"r"}}', b'{"id":4,"parent":3,"body":{"kind":"response"}}']
    with caplog.at_level(logging.WARNING, logger='step_file'):
        nodes = parse_nodes(lines, LOG)
    assert sorted(nodes) == [4]
    assert 'base node 1' in caplog.text
