"""The message-node log format: full nodes, restamps, and damaged lines."""

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


def written_lines(writer: NodeWriter, data: bytes) -> list[bytes]:
    """Feed `data` to the writer as its log's fold does after an append."""
    lines = data.splitlines()
    for line in lines:
        assert writer.start is not None
        writer.add(writer.end - writer.start + 1, line)  # the line's number in the file, from 1
    return lines


def test_restamp_of_a_sibling_stores_only_changed_fields() -> None:
    writer = NodeWriter(LOG)
    first, ids, written = writer.encode(None, [body(timestamp=None)])
    first_lines = written_lines(writer, first)
    writer.commit(written)
    first_id = ids[0]
    assert writer.start == first_id
    # The same request, stamped later, saved again under the same parent.
    second, ids, written = writer.encode(None, [body(timestamp='2026-01-01T00:00:00Z', run_id='r')])
    second_lines = written_lines(writer, second)
    writer.commit(written)
    assert ids == [first_id + 1]
    assert writer.end == first_id + 2
    line = json.loads(second)
    assert (line['base'], line['set']) == (first_id, {'timestamp': '2026-01-01T00:00:00Z', 'run_id': 'r'})
    assert len(second) < len(first) // 4

    nodes, end = parse_nodes([*first_lines, *second_lines], LOG)
    assert end == first_id + 2
    assert json.loads(nodes[first_id + 1][1]) == json.loads(body(timestamp='2026-01-01T00:00:00Z', run_id='r'))
    assert [node_id_of(x) for x in (*first_lines, *second_lines)] == [first_id, first_id + 1]


def test_different_parts_or_uncommitted_bases_are_stored_in_full() -> None:
    writer = NodeWriter(LOG)
    _, _, written = writer.encode(None, [body()])
    # Not committed (the write failed): it must not be used as a base.
    data, _, _ = writer.encode(None, [body(run_id='r')])
    assert b'"body":' in data
    writer.commit(written)
    writer.end = 1
    other = json.dumps({'parts': [{'content': 'y' * 900}], 'kind': 'request'}).encode()
    data, _, _ = writer.encode(None, [other])
    assert b'"body":' in data
    # Only the first new message of a save can have a sibling.
    data, ids, _ = writer.encode(5, [body(), body(run_id='r')])
    assert data.count(b'"body":') == 2
    assert ids == [1, 2]


def test_damaged_lines_are_handed_over_raw_when_their_id_can_be_read(caplog: pytest.LogCaptureFixture) -> None:
    restamp = b'{"id":3,"parent":2,"base":1,"set":{"run_id":"r"}}'  # its base node 1 is missing
    garbled = b'{"id":5,"parent":4,"body":{"kind":"resp'
    lines = [restamp, b'{"id":4,"parent":3,"body":{"kind":"response"}}', garbled, b'not a node at all']
    with caplog.at_level(logging.WARNING, logger='step_file'):
        nodes, end = parse_nodes(lines, LOG)
    assert nodes == {3: (2, restamp), 4: (3, b'{"kind":"response"}'), 5: (4, garbled)}
    assert end == 6
    assert 'line 4 of messages.jsonl is damaged' in caplog.text


def test_the_end_counts_lines_whose_id_cannot_be_read(caplog: pytest.LogCaptureFixture) -> None:
    writer = NodeWriter(LOG)
    with caplog.at_level(logging.WARNING, logger='step_file'):
        writer.add(1, b'{"id":0,"parent":null,"body":{}}')
        writer.add(2, b'\x00\x00garbage')
    assert writer.end == 2  # a snapshot naming node 1 is damaged, not uncommitted
    assert 'line 2 of messages.jsonl is damaged' in caplog.text
