"""The bytes the engine's write path stores, pinned: a faster write path must store exactly these.

A fixed workload (a run record, events, ledger entries, snapshots that grow, are rewritten and
shortened) goes through `write_batch`, `append_event`, `record_tool_effect` and `save_snapshot`
of an in-memory store; every stored body (records sealed with their checksum, message nodes with
their chained sums) is compared with what stepcore stored before the write path was tuned. Every
port stores the bodies the engine hands it, so the memory port stands for all of them.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pydantic_ai
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage

from stepcore import (
    ContinuableSnapshot,
    EventKind,
    InMemoryStepStore,
    RunRecord,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
)
from stepcore.common.encryption import Encryption
from stepcore.engine._seal import CHECKSUM_KEY, Sealer
from stepcore.store.codec import FORMAT_KEY

T0 = datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
RUN = 'run-1'

PINNED_WITH = '2.68.0'
"""The pydantic-ai release the pins below were taken with: message bodies (and so the snapshot
headers' sums of their newest message) are pydantic-ai's serialization, which other releases
change. Under any release the layout itself is checked (`test_every_record_is_stored_canonical`)."""
PINNED_DIGEST = '683424106a56318ea66641bd98aadb8e02f16324d0c9e06b3dfc5ff17ad8670c'
"""sha256 of the `repr` of every stored row of `workload`, as stepcore stored them before the tuning."""
PINNED_ROWS = 72


def at(i: int) -> datetime:
    return T0 + timedelta(seconds=i, microseconds=i * 7)


def history(n: int) -> list[ModelMessage]:
    out: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content='go “ü” \u2028', timestamp=T0)], timestamp=T0, run_id='rid')
    ]
    for i in range(n):
        out.append(
            ModelResponse(
                parts=[ToolCallPart('fetch', {'i': i, 'z': [1.5, None, True]}, tool_call_id=f'call-{i}')],
                timestamp=at(i),
                usage=RequestUsage(input_tokens=i, output_tokens=2 * i),
                model_name='m',
            )
        )
        out.append(
            ModelRequest(
                parts=[ToolReturnPart('fetch', 'x' * (50 + i), tool_call_id=f'call-{i}', timestamp=at(i))],
                timestamp=at(i),
                run_id='rid',
                instructions='be brief' if i % 2 else None,
            )
        )
    return out


def started(step: int) -> ToolEffectRecord:
    return ToolEffectRecord(
        run_id=RUN,
        tool_call_id=f'call-{step}',
        tool_name='fetch',
        status=ToolEffectStatus.STARTED,
        started_at=at(step),
        updated_at=at(step),
        step_index=step,
        args={'i': step, 'b': {'y': 'é', 'a': 1e300}},
    )


def finished(step: int) -> ToolEffectRecord:
    return ToolEffectRecord(
        run_id=RUN,
        tool_call_id=f'call-{step}',
        tool_name='fetch',
        status=ToolEffectStatus.COMPLETED if step != 4 else ToolEffectStatus.FAILED,
        started_at=at(step),
        updated_at=at(step + 1),
        ended_at=at(step + 1),
        step_index=step,
        args={'i': step},
        error=None if step != 4 else 'ValueError: “bad”',
        effect_summary='s' if step == 2 else None,
    )


async def workload(store: InMemoryStepStore) -> list[ModelMessage]:
    """Write the fixed workload; returns the newest snapshot's history."""
    await store.register_run(
        RunRecord(run_id=RUN, agent_name='a', started_at=T0, metadata={'tenant': 'acme'}, registration_id='reg')
    )
    messages = history(0)
    for step in range(6):
        await store.write_batch(
            [
                StepEvent(
                    run_id=RUN,
                    kind=EventKind.MODEL_REQUEST_STARTED,
                    step_index=step,
                    timestamp=at(step),
                    agent_name='a',
                    idempotency_key=f'model_request_started:{step}:1',
                    metadata={} if step % 2 else {'k': 'v'},
                ),
                StepEvent(
                    run_id=RUN,
                    kind=EventKind.MODEL_REQUEST_COMPLETED,
                    step_index=step,
                    timestamp=at(step),
                    conversation_id='conv',
                    idempotency_key=f'model_request_completed:{step}:1',
                ),
                started(step),
                StepEvent(
                    run_id=RUN,
                    kind=EventKind.TOOL_CALL_STARTED,
                    step_index=step,
                    timestamp=at(step),
                    tool_call_id=f'call-{step}',
                    tool_name='fetch',
                    idempotency_key=f'tool_call_started:call-{step}:1',
                ),
            ]
        )
        messages = messages + history(step + 1)[len(messages) :]
        if step == 3:  # a message older than the tail replaced
            messages = [*messages[:2], ModelResponse(parts=[TextPart('rewritten')], timestamp=T0), *messages[3:]]
        snapshot = ContinuableSnapshot(
            run_id=RUN,
            step_index=step,
            messages=list(messages),
            timestamp=at(step),
            agent_name='a',
            state=SnapshotState.COMPLETE if step != 5 else SnapshotState.INTERRUPTED,
            idempotency_key=f'snapshot:{step}:{step}:complete' if step != 2 else None,
            metadata={'m': 'x'} if step == 1 else {},
        )
        completed = StepEvent(
            run_id=RUN,
            kind=EventKind.TOOL_CALL_COMPLETED,
            step_index=step,
            timestamp=at(step + 1),
            tool_call_id=f'call-{step}',
            tool_name='fetch',
            idempotency_key=f'tool_call_completed:call-{step}:1',
        )
        await store.write_batch([completed, finished(step)], snapshot=snapshot)
    await store.append_event(
        StepEvent(
            run_id=RUN,
            kind=EventKind.RUN_FAILED,
            step_index=6,
            timestamp=at(9),
            error='Boom: "q" \\ \x01',
            idempotency_key='run_failed:run:1',
        )
    )
    await store.record_tool_effect(
        ToolEffectRecord(
            run_id=RUN, tool_call_id='call-x', tool_name='t', status=ToolEffectStatus.STARTED, started_at=at(9)
        )
    )
    await store.save_snapshot(
        ContinuableSnapshot(run_id=RUN, step_index=7, messages=list(messages[:5]), timestamp=at(10))
    )
    await store.save_snapshot(
        ContinuableSnapshot(
            run_id=RUN,
            step_index=8,
            messages=list(messages),
            timestamp=datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2))),
        )
    )
    return messages


def stored_rows(store: InMemoryStepStore) -> list[tuple[Any, ...]]:
    port: Any = store.port
    data = port._data[RUN]
    rows: list[tuple[Any, ...]] = [('run', port._runs[RUN].body)]
    rows += [('event', r.idempotency_key, r.body) for r in data.events]
    rows += [('effect', r.tool_call_id, r.status, r.body) for r in data.effects.values()]
    rows += [('snapshot', r.seq, r.state, r.head, r.length, r.body) for r in data.snapshots]
    rows += [('node', k, p, b) for k, (p, b) in sorted(data.nodes.items())]
    return rows


async def test_the_stored_bytes_are_pinned() -> None:
    store = InMemoryStepStore()
    messages = await workload(store)
    latest = await store.latest_snapshot(RUN)
    assert latest is not None
    assert latest.messages == messages
    rows = stored_rows(store)
    assert rows[:2] == [
        (
            'run',
            b'{"format":2,"c":"0a83b3afdca1cb7c","agent_name":"a","metadata":{"tenant":"acme"},'
            b'"registration_id":"reg","started_at":"2026-03-04T05:06:07.890123Z"}',
        ),
        (
            'event',
            'model_request_started:0:1',
            b'{"format":2,"c":"b4a839f536ec035b","agent_name":"a","idempotency_key":"model_request_started:0:1",'
            b'"kind":"model_request_started","metadata":{"k":"v"},"step_index":0,'
            b'"timestamp":"2026-03-04T05:06:07.890123Z"}',
        ),
    ]
    effect = next(r for r in rows if r[0] == 'effect')
    assert effect == (
        'effect',
        'call-0',
        'completed',
        b'{"format":2,"c":"54a3c5b99f1fa21e","args":{"i":0},"ended_at":"2026-03-04T05:06:08.890130Z",'
        b'"started_at":"2026-03-04T05:06:07.890123Z","status":"completed","step_index":0,"tool_call_id":"call-0",'
        b'"tool_name":"fetch","updated_at":"2026-03-04T05:06:08.890130Z"}',
    )
    if pydantic_ai.__version__ != PINNED_WITH:
        return  # the records above hold no message; the rest is checked by layout below
    snapshot = next(r for r in rows if r[0] == 'snapshot')
    assert snapshot == (
        'snapshot',
        1,
        'complete',
        3,
        3,
        b'{"format":2,"c":"f385d24de1520430","agent_name":"a","created_at":"2026-03-04T05:06:07.890123Z",'
        b'"h":"707dc119f2020d9f","idempotency_key":"snapshot:0:0:complete","state":"complete","step_index":0}',
    )
    assert (len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()) == (PINNED_ROWS, PINNED_DIGEST)


async def test_every_record_is_stored_canonical() -> None:
    # What the write path stored before it was tuned, under any pydantic-ai release: the format
    # stamp, the checksum, then the other fields sorted and compact, summed with the row's columns.
    store = InMemoryStepStore()
    await workload(store)
    sealer = Sealer()
    columns: dict[str, Any] = {
        'run': lambda row: (RUN,),
        'event': lambda row: (RUN,),
        'effect': lambda row: (RUN, row[1], row[2]),
        'snapshot': lambda row: (RUN, row[2], row[4]),
    }
    checked = 0
    for row in stored_rows(store):
        if row[0] == 'node':
            continue
        body = row[-1]
        fields = json.loads(body)
        rest = {k: v for k, v in fields.items() if k not in (FORMAT_KEY, CHECKSUM_KEY)}
        tail = json.dumps(rest, sort_keys=True, separators=(',', ':'), ensure_ascii=False).encode()
        assert body == b'{"format":2,"c":"%s",%s' % (fields[CHECKSUM_KEY].encode(), tail[1:])
        assert sealer.check_record(body, columns[row[0]](row))
        checked += 1
    assert checked == PINNED_ROWS - sum(1 for row in stored_rows(store) if row[0] == 'node')


async def test_an_encrypted_workload_reads_back() -> None:
    # Encrypted bodies carry a random nonce, so they cannot be pinned: they must read back.
    store = InMemoryStepStore(encryption=Encryption(keys={'k1': bytes(range(32))}))
    messages = await workload(store)
    plain = InMemoryStepStore()
    await workload(plain)
    latest = await store.latest_snapshot(RUN)
    assert latest is not None
    assert latest.messages == messages
    assert await store.list_events(RUN) == await plain.list_events(RUN)
    assert await store.list_tool_effects(RUN) == await plain.list_tool_effects(RUN)
    assert await store.list_snapshots(RUN, include_interrupted=True) == await plain.list_snapshots(
        RUN, include_interrupted=True
    )
    assert await store.get_run(RUN) == await plain.get_run(RUN)
