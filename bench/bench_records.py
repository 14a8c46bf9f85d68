"""What encoding and decoding one stored record costs, per record type.

Not a test: run `uv run python bench/bench_records.py [--rounds 9] [--number 20000]`.

For each record the engine stores (run record, step event, ledger entry, snapshot header) it
times, in microseconds per record:

- `build`: constructing the record with every field given (validated);
- `encode`: the stored body (`stepcore.store.codec.record_fields`, what the engine seals) and its compact
  bytes (`dump_record_compact`);
- `decode`: the record back from its stored fields (`stepcore.store.codec.load_record`).

Rounds interleave the record types; the medians over rounds are printed as a Markdown table,
with the process CPU time of the whole run. The script uses only calls that the records of every
stepcore release since 0.1 have, so the same file measures two versions of the code: point
`PYTHONPATH` at another checkout's `packages/stepcore/src` to time that one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic_ai.messages import ModelRequest, UserPromptPart

import stepcore
from stepcore.store.codec import dump_record_compact, load_record, record_fields
from stepcore.store.models import (
    ContinuableSnapshot,
    EventKind,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)

WHEN = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
SNAPSHOT_TIME = 'timestamp' if 'timestamp' in getattr(ContinuableSnapshot, '__dataclass_fields__', {}) else 'created_at'


def run_record() -> RunRecord:
    return RunRecord(
        run_id='run-1',
        agent_name='librarian',
        conversation_id='conv-1',
        parent_run_id='orch-1',
        started_at=WHEN,
        metadata={'team': 'search'},
        registration_id='0123456789abcdef',
    )


def event() -> StepEvent:
    return StepEvent(
        run_id='run-1',
        kind=EventKind.TOOL_CALL_STARTED,
        step_index=7,
        timestamp=WHEN,
        agent_name='librarian',
        conversation_id='conv-1',
        tool_name='lookup',
        tool_call_id='call-7',
        metadata={'team': 'search'},
        idempotency_key='tool_call_started:call-7:1',
    )


def effect() -> ToolEffectRecord:
    return ToolEffectRecord(
        run_id='run-1',
        tool_call_id='call-7',
        tool_name='lookup',
        status=ToolEffectStatus.COMPLETED,
        started_at=WHEN,
        updated_at=WHEN,
        step_index=7,
        idempotency_key='lookup:42',
        effect_summary='looked up 42',
        args={'query': 'ThinkingPartDelta', 'limit': 5},
    )


def snapshot() -> ContinuableSnapshot:
    fields: dict[str, Any] = {
        'run_id': 'run-1',
        'step_index': 7,
        'messages': [ModelRequest(parts=[UserPromptPart('hello')])],
        'state': SnapshotState.COMPLETE,
        SNAPSHOT_TIME: WHEN,
        'agent_name': 'librarian',
        'conversation_id': 'conv-1',
        'metadata': {'team': 'search'},
        'idempotency_key': 'snapshot:3:7:complete',
    }
    return ContinuableSnapshot(**fields)


CASES: dict[str, tuple[Callable[[], Any], frozenset[str], dict[str, Any]]] = {
    'run record': (run_record, frozenset({'run_id'}), {'run_id': 'run-1'}),
    'step event': (event, frozenset({'run_id', 'seq'}), {'run_id': 'run-1', 'seq': 3}),
    'ledger entry': (effect, frozenset({'run_id'}), {'run_id': 'run-1'}),
    'snapshot header': (snapshot, frozenset({'run_id', 'seq', 'messages'}), {'run_id': 'run-1', 'seq': 3}),
}


def per_record(action: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        action()
    return (time.perf_counter() - start) / number * 1e6


def measure(name: str, number: int) -> dict[str, float]:
    make, in_row, extra = CASES[name]
    record = make()
    stored = record_fields(record, exclude=in_row)
    header_extra = {'messages': []} if name == 'snapshot header' else {}
    cls = type(record)
    return {
        'build': per_record(make, number),
        'encode': per_record(lambda: record_fields(record, exclude=in_row), number),
        'compact': per_record(lambda: dump_record_compact(record, exclude=in_row), number),
        'decode': per_record(lambda: load_record(cls, stored, **extra, **header_extra), number),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=9)
    parser.add_argument('--number', type=int, default=20000)
    args = parser.parse_args()
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in CASES}
    cpu = time.process_time()
    for _ in range(args.rounds):
        for name in CASES:
            for column, value in measure(name, args.number).items():
                samples[name].setdefault(column, []).append(value)
    cpu = time.process_time() - cpu
    print(f'stepcore at {stepcore.__file__}: medians of {args.rounds} interleaved rounds, µs per record')
    print()
    print('| record | build | encode (fields) | encode (bytes) | decode |')
    print('|---|---|---|---|---|')
    for name, columns in samples.items():
        cells = [f'{statistics.median(columns[c]):.2f}' for c in ('build', 'encode', 'compact', 'decode')]
        print(f'| {name} | ' + ' | '.join(cells) + ' |')
    print()
    print(f'process CPU time: {cpu:.1f} s')


if __name__ == '__main__':
    main()
