"""The older layouts: the same kind of runs as an earlier reference release stored them."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai_harness.step_persistence import StepPersistence, StepStore
from scenarios import answer, call, run_finished, scripted

PRE_STATE_SQLITE_SCHEMA = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    conversation_id TEXT,
    parent_run_id TEXT,
    agent_name TEXT,
    metadata TEXT NOT NULL,
    started_at TEXT NOT NULL
);
CREATE INDEX idx_runs_conv ON runs(conversation_id);
CREATE INDEX idx_runs_parent ON runs(parent_run_id);
CREATE INDEX idx_runs_started ON runs(started_at);

CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    step_index INTEGER NOT NULL,
    timestamp TEXT NOT NULL,
    conversation_id TEXT,
    parent_run_id TEXT,
    agent_name TEXT,
    tool_call_id TEXT,
    tool_name TEXT,
    error TEXT,
    metadata TEXT NOT NULL
);
CREATE INDEX idx_events_run ON events(run_id, seq);

CREATE TABLE snapshots (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    step_index INTEGER NOT NULL,
    conversation_id TEXT,
    parent_run_id TEXT,
    agent_name TEXT,
    timestamp TEXT NOT NULL,
    messages TEXT NOT NULL
);
CREATE INDEX idx_snapshots_run ON snapshots(run_id, seq);

CREATE TABLE tool_effects (
    run_id TEXT NOT NULL,
    tool_call_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at TEXT NOT NULL,
    ended_at TEXT,
    idempotency_key TEXT,
    effect_summary TEXT,
    PRIMARY KEY (run_id, tool_call_id)
);
"""
"""The 0.62.0 DDL without what `SqliteStepStore._ensure_schema` adds to a database that lacks it."""


PRE_STATE_RUNS = ('fx-finished', 'fx-legacy-second')


async def write_pre_state_sources(store: StepStore) -> None:
    """The two runs copied into the older layouts, written by the reference into a scratch store."""
    await run_finished(store)
    agent = Agent(
        scripted(
            call('lookup', 'call-legacy-1', key='beta'), call('lookup', 'call-legacy-2', key='gamma'), answer('2')
        ),
        name='fixture_agent',
        capabilities=[StepPersistence(store=store, run_id='fx-legacy-second', agent_name='legacy')],
    )

    @agent.tool_plain
    def lookup(key: str) -> str:
        return f'{key}=2'

    await agent.run('what are beta and gamma?', conversation_id='conv-finished', run_id='ctx-legacy-second')


def copy_to_pre_state_sqlite(source: Path, target: Path, *, page_size: int) -> None:
    target.unlink(missing_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        dst.execute(f'PRAGMA page_size={page_size}')
        dst.executescript(PRE_STATE_SQLITE_SCHEMA)
        for run_id in PRE_STATE_RUNS:
            dst.execute(
                'INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)',
                src.execute(
                    'SELECT run_id, conversation_id, parent_run_id, agent_name, metadata, started_at FROM runs '
                    'WHERE run_id = ?',
                    (run_id,),
                ).fetchone(),
            )
            dst.executemany(
                'INSERT INTO events (run_id, kind, step_index, timestamp, conversation_id, parent_run_id, agent_name, '
                'tool_call_id, tool_name, error, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
                src.execute(
                    'SELECT run_id, kind, step_index, timestamp, conversation_id, parent_run_id, agent_name, '
                    'tool_call_id, tool_name, error, metadata FROM events WHERE run_id = ? ORDER BY seq',
                    (run_id,),
                ).fetchall(),
            )
            for seq, step_index, conv, parent, agent_name, timestamp in src.execute(
                'SELECT seq, step_index, conversation_id, parent_run_id, agent_name, timestamp FROM snapshots '
                "WHERE run_id = ? AND state = 'complete' ORDER BY seq",
                (run_id,),
            ).fetchall():
                history = [
                    json.loads(row[0])
                    for row in src.execute(
                        'SELECT m.message FROM snapshot_message_refs r JOIN snapshot_messages m ON m.sha256 = r.sha256 '
                        'WHERE r.snapshot_seq = ? ORDER BY r.position',
                        (seq,),
                    )
                ]
                dst.execute(
                    'INSERT INTO snapshots (run_id, step_index, conversation_id, parent_run_id, agent_name, timestamp, '
                    'messages) VALUES (?, ?, ?, ?, ?, ?, ?)',
                    (run_id, step_index, conv, parent, agent_name, timestamp, json.dumps(history)),
                )
            dst.executemany(
                'INSERT INTO tool_effects VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
                src.execute(
                    'SELECT run_id, tool_call_id, tool_name, status, started_at, ended_at, idempotency_key, '
                    'effect_summary FROM tool_effects WHERE run_id = ?',
                    (run_id,),
                ).fetchall(),
            )
    with sqlite3.connect(target) as dst:
        dst.execute('VACUUM')


def copy_to_pre_state_files(source: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    for run_id in PRE_STATE_RUNS:
        src_dir, dst_dir = source / run_id, target / run_id
        (dst_dir / 'snapshots').mkdir(parents=True)
        run = json.loads((src_dir / 'run.json').read_text())
        del run['registration_id']
        (dst_dir / 'run.json').write_text(json.dumps(run))
        lines = []
        for raw in (src_dir / 'events.jsonl').read_text().splitlines():
            event = json.loads(raw)
            del event['idempotency_key']
            lines.append(json.dumps(event) + '\n')
        (dst_dir / 'events.jsonl').write_text(''.join(lines))
        shutil.copy(src_dir / 'tool_effects.jsonl', dst_dir / 'tool_effects.jsonl')
        seq = 0
        for path in sorted((src_dir / 'snapshots').glob('*.json'), key=lambda p: int(p.stem)):
            snapshot = json.loads(path.read_text())
            if snapshot['state'] != 'complete':
                continue
            del snapshot['state'], snapshot['idempotency_key']
            (dst_dir / 'snapshots' / f'{seq}.json').write_text(json.dumps(snapshot))
            seq += 1


async def verify_pre_state(original: StepStore, migrated: StepStore) -> list[dict[str, Any]]:
    """The older copy, opened by the reference, reads back the same runs with only their complete snapshots."""
    runs = []
    for run_id in PRE_STATE_RUNS:
        before = await original.list_snapshots(run_id=run_id)  # type: ignore[attr-defined]
        after = await migrated.list_snapshots(run_id=run_id, include_interrupted=True)  # type: ignore[attr-defined]
        assert [s.messages for s in after] == [s.messages for s in before], run_id
        assert all(s.state == 'complete' and s.idempotency_key is None for s in after)
        events = await migrated.list_events(run_id=run_id)
        assert [e.kind for e in events] == [e.kind for e in await original.list_events(run_id=run_id)]
        assert all(e.idempotency_key is None for e in events)
        record = await migrated.get_run(run_id=run_id)
        assert record is not None
        assert record.registration_id is None
        effects = [
            await migrated.get_tool_effect(run_id=run_id, tool_call_id=e.tool_call_id)
            for e in events
            if e.kind == 'tool_call_started' and e.tool_call_id is not None
        ]
        runs.append(
            {
                'run_id': run_id,
                'agent_name': record.agent_name,
                'conversation_id': record.conversation_id,
                'snapshot_count': len(after),
                'snapshot_step_indexes': [s.step_index for s in after],
                'message_counts': [len(s.messages) for s in after],
                'event_kinds': [e.kind for e in events],
                'tool_effects': [
                    {'tool_call_id': e.tool_call_id, 'status': e.status} for e in effects if e is not None
                ],
            }
        )
    return runs
