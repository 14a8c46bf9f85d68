"""Reading the written runs back through the reference stores, for the manifests."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic_ai_harness.step_persistence import StepStore
from pydantic_ai_harness.step_persistence.recovery import inspect_recovery
from scenarios import Scenario

MARKER_KEY = '__harness_external_media__'
TEXT_MARKER_KEY = '__harness_external_text__'
URI_KEY = '__harness_external_uri__'


def find_markers(node: object, found: list[dict[str, Any]]) -> None:
    """Collect externalized-media markers from a stored (not restored) message tree."""
    if isinstance(node, list):
        for item in node:
            find_markers(item, found)
    elif isinstance(node, dict):
        if node.get(MARKER_KEY) is True:
            uri = node.get(URI_KEY, node.get('uri'))
            found.append(
                {
                    'uri': uri,
                    'sha256': str(uri).removeprefix('media+sha256://'),
                    'kind': 'text' if node.get(TEXT_MARKER_KEY) is True else 'binary',
                    'marker_keys': sorted(node),
                }
            )
        for value in node.values():
            find_markers(value, found)


def unique_media(markers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for marker in markers:
        seen.setdefault(marker['sha256'], marker)
    return sorted(seen.values(), key=lambda m: m['sha256'])


def sqlite_stored(database: Path, run_id: str) -> tuple[list[int], list[object]]:
    """Stored snapshot seqs of a run, and each snapshot's stored (externalized) history."""
    with sqlite3.connect(database) as conn:
        seqs = [row[0] for row in conn.execute('SELECT seq FROM snapshots WHERE run_id = ? ORDER BY seq', (run_id,))]
        histories: list[object] = []
        for seq in seqs:
            (stored,) = conn.execute('SELECT messages FROM snapshots WHERE seq = ?', (seq,)).fetchone()
            if stored.startswith('['):  # releases before 0.58 keep each history inline
                histories.append(json.loads(stored))
                continue
            rows = conn.execute(
                'SELECT m.message FROM snapshot_message_refs r JOIN snapshot_messages m ON m.sha256 = r.sha256 '
                'WHERE r.snapshot_seq = ? ORDER BY r.position',
                (seq,),
            ).fetchall()
            histories.append([json.loads(row[0]) for row in rows])
    return seqs, histories


def file_stored(directory: Path, run_id: str) -> tuple[list[int], list[object]]:
    snap_dir = directory / run_id / 'snapshots'
    seqs = sorted(int(path.stem) for path in snap_dir.glob('*.json'))
    histories = [json.loads((snap_dir / f'{seq}.json').read_text())['messages'] for seq in seqs]
    return seqs, histories


def media_sizes_sqlite(database: Path) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(database) as conn:
        return {
            sha: {'media_type': media_type, 'size_bytes': size}
            for sha, media_type, size in conn.execute('SELECT sha256, media_type, size_bytes FROM media')
        }


def media_sizes_file(directory: Path) -> dict[str, dict[str, Any]]:
    return {path.stem: {'size_bytes': path.stat().st_size} for path in (directory / 'media').glob('*.bin')}


async def describe_run(
    store: StepStore,
    run_id: str,
    stored: Callable[[str], tuple[list[int], list[object]]],
    media: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    record = await store.get_run(run_id=run_id)
    assert record is not None, run_id
    events = await store.list_events(run_id=run_id)
    snapshots = await store.list_snapshots(run_id=run_id, include_interrupted=True)  # type: ignore[attr-defined]
    seqs, histories = stored(run_id)
    assert len(seqs) == len(snapshots), (run_id, seqs, len(snapshots))
    recovery = await inspect_recovery(store=store, run_id=run_id)
    tool_call_ids = list(dict.fromkeys(e.tool_call_id for e in events if e.tool_call_id is not None))
    effects = []
    for tool_call_id in tool_call_ids:
        effect = await store.get_tool_effect(run_id=run_id, tool_call_id=tool_call_id)
        assert effect is not None
        effects.append(
            {
                'tool_call_id': effect.tool_call_id,
                'tool_name': effect.tool_name,
                'status': effect.status,
                'idempotency_key': effect.idempotency_key,
                'effect_summary': effect.effect_summary,
                'has_ended_at': effect.ended_at is not None,
            }
        )
    markers: list[dict[str, Any]] = []
    snapshot_entries = []
    for seq, snapshot, history in zip(seqs, snapshots, histories, strict=True):
        found: list[dict[str, Any]] = []
        find_markers(history, found)
        markers += found
        snapshot_entries.append(
            {
                'seq': seq,
                'step_index': snapshot.step_index,
                'state': snapshot.state,
                'idempotency_key': snapshot.idempotency_key,
                'message_count': len(snapshot.messages),
                'message_kinds': [message.kind for message in snapshot.messages],
                'externalized': sorted({m['sha256'] for m in found}),
            }
        )
    media_entries = [{**marker, **media.get(marker['sha256'], {})} for marker in unique_media(markers)]
    return {
        'run_id': run_id,
        'agent_name': record.agent_name,
        'conversation_id': record.conversation_id,
        'parent_run_id': record.parent_run_id,
        'metadata': record.metadata,
        'has_registration_id': record.registration_id is not None,
        'events': [
            {
                'kind': e.kind,
                'step_index': e.step_index,
                'tool_call_id': e.tool_call_id,
                'tool_name': e.tool_name,
                'error': e.error,
                'idempotency_key': e.idempotency_key,
            }
            for e in events
        ],
        'snapshots': snapshot_entries,
        'snapshot_count': {
            'complete': sum(1 for s in snapshots if s.state == 'complete'),
            'all': len(snapshots),
        },
        'latest': None
        if recovery.latest is None
        else {'step_index': recovery.latest.step_index, 'state': recovery.latest.state},
        'settled': None if recovery.settled is None else {'step_index': recovery.settled.step_index},
        'tool_effects': effects,
        'unresolved': [e.tool_call_id for e in recovery.unresolved],
        'completed_tools': list(recovery.completed_tools),
        'failed_tools': list(recovery.failed_tools),
        'media': media_entries,
    }


def resolve_ids(scenarios: list[Scenario], runs: Sequence[Any]) -> None:
    """Fill the derived run ids in: the `sp-` id of an agent_name-derived run, found by its agent and lineage."""
    known = {s['run_id'] for s in scenarios if 'run_id' in s}
    derived = [r for r in runs if r.run_id not in known]
    for scenario in scenarios:
        if 'run_id' in scenario:
            continue
        matches = [r for r in derived if r.run_id.startswith('sp-') and r.agent_name == scenario['derived_agent_name']]
        matches = [
            r for r in matches if decode_derived(r.run_id) == (scenario['derived_agent_name'], scenario['ctx_run_id'])
        ]
        assert len(matches) == 1, scenario
        scenario['run_id'] = matches[0].run_id


def decode_derived(run_id: str) -> tuple[str, str]:
    """Undo the reference's `sp-` encoding: base64url without padding of `{len(name bytes)}:{name}{ctx.run_id}`."""
    payload = run_id.removeprefix('sp-')
    raw = base64.urlsafe_b64decode(payload + '=' * (-len(payload) % 4)).decode()
    length, _, rest = raw.partition(':')
    name_bytes = rest.encode()[: int(length)]
    name = name_bytes.decode()
    return name, rest[len(name) :]


def check_expectations(runs: dict[str, dict[str, Any]]) -> None:
    """What the scenarios are for; a change in the reference's behaviour stops the script here."""
    finished = runs['fx-finished']
    assert finished['agent_name'] == 'fixture_agent'
    assert [e['status'] for e in finished['tool_effects']] == ['completed']
    assert {s['state'] for s in finished['snapshots']} == {'complete'}
    crashed = runs['fx-crashed']
    assert crashed['unresolved'] == ['call-crash-2']
    charge = next(e for e in crashed['tool_effects'] if e['tool_call_id'] == 'call-crash-2')
    assert charge['status'] == 'started'
    assert charge['idempotency_key'] == 'charge-order-42'
    assert charge['effect_summary'] == 'charge 1999 cents for order 42'
    assert crashed['snapshots'][-1]['state'] == 'interrupted'
    assert crashed['events'][-1]['kind'] == 'tool_call_started'
    failed = runs['fx-tool-failed']
    assert failed['tool_effects'][0]['status'] == 'failed'
    assert failed['tool_effects'][0]['effect_summary'] == "ValueError('card declined')"
    assert failed['tool_effects'][0]['idempotency_key'] == 'refund-7'
    assert failed['events'][-1]['kind'] == 'run_failed'
    media = runs['fx-media']
    assert sorted(m['kind'] for m in media['media']) == ['binary', 'text']
    pruned = runs['fx-pruned']
    assert pruned['snapshot_count']['all'] == 2


async def read_back(
    store: StepStore,
    scenarios: list[Scenario],
    stored: Callable[[str], tuple[list[int], list[object]]],
    media: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    runs = await store.list_runs()
    resolve_ids(scenarios, runs)
    assert sorted(r.run_id for r in runs) == sorted(s['run_id'] for s in scenarios)
    described: list[dict[str, Any]] = []
    for scenario in scenarios:
        entry = await describe_run(store, scenario['run_id'], stored, media)
        described.append({**{k: v for k, v in scenario.items() if k != 'run_id'}, **entry})
    check_expectations({d['scenario'] if d['run_id'].startswith('sp-') else d['run_id']: d for d in described})
    return described
