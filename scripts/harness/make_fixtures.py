"""Write step-persistence fixtures with pydantic-ai-harness 0.62.0, for stepcore's compatibility tests.

Every record in the fixtures is written by the reference library itself: real `Agent.run` calls on
a `FunctionModel` (no network) with its `StepPersistence` capability and its `SqliteStepStore` /
`FileStepStore`. Nothing of stepcore is imported.

Create the reference environment once (any directory; this one is assumed below):

    uv venv --python 3.11 /work/ref/.venv && \
        uv pip install --python /work/ref/.venv/bin/python pydantic-ai-harness==0.62.0

Then, from the repository root:

    /work/ref/.venv/bin/python scripts/harness/make_fixtures.py

It replaces, and only touches:

    packages/step-sqlite/tests/fixtures/harness/  harness.db, harness-pre-state.db, manifest.json
    packages/step-file/tests/fixtures/harness/    store/, store-pre-state/, manifest.json

Run by an environment with an earlier release installed, the script writes that release's fixtures
beside them instead, named for the release, and touches nothing else (no older layouts are made
from an earlier release):

    uv venv --python 3.11 /tmp/harness-0.57 && \
        uv pip install --python /tmp/harness-0.57/bin/python pydantic-ai-harness==0.57.0
    /tmp/harness-0.57/bin/python scripts/harness/make_fixtures.py

    packages/step-sqlite/tests/fixtures/harness/  harness-0.57.0.db, manifest-0.57.0.json
    packages/step-file/tests/fixtures/harness/    store-0.57.0/, manifest-0.57.0.json

What the releases from 0.52.0 to 0.62.0 write (each pins the pydantic-ai release of the same minor):

- SQLite, 0.52.0-0.57.0: every snapshot row holds its whole history inline, as a JSON list in
  `snapshots.messages`; there are no `snapshot_messages` / `snapshot_message_refs` tables.
- SQLite, 0.58.0-0.62.0: each message is stored once in `snapshot_messages`, and a snapshot row holds
  `{"stored_messages": N}` with its history in `snapshot_message_refs`.
- Files: the same layout in every one of them.
- Externalized media markers: from 0.60.0 a binary marker records a URL-safe base64 source under
  `__harness_external_urlsafe__`, and a caller dict carrying a reserved key is wrapped under
  `__harness_external_literal__`; earlier markers have neither.
- Every one of them has the snapshot `state` column, `idempotency_key` on events and snapshots and
  `registration_id` on runs (all already there in 0.20.0), so the layout without them
  (`*-pre-state`, below) is only made by hand here.

The scenarios live in `scenarios.py`, the reading back for the manifests in `readback.py`, the older
layouts in `pre_state.py`.

Each `manifest.json` lists every run written (ids, agent names, conversations, parents, events,
snapshots with their states, ledger entries, externalized media) as read back through the
reference stores, so tests can assert against it. Ids and contents are fixed; timestamps (and so
the message hashes that cover them) are the wall clock of the run, as the reference records them.

Scenarios, identical in both stores:

- fx-finished: one tool cycle, then a final answer (completed ledger entry, complete snapshots).
- fx-crashed: `capture_frontier=True`; the first tool completes, the second annotates its effect
  (idempotency key and summary) and then the process is killed (`os._exit`, in a child process),
  so its ledger entry stays `started` and the newest snapshot is `interrupted`.
- fx-tool-failed: the tool annotates an idempotency key and raises `ValueError`; the ledger entry is
  `failed` and the failure snapshot `interrupted`.
- fx-media: a prompt with a 64 KiB `BinaryContent` image (externalized) and a 16 byte one (kept
  inline), and a tool that returns 64 KiB of text (externalized as text).
- two runs of one conversation (`conv-shared`), ids derived from `agent_name` (`sp-...`).
- fx-orchestrator and a delegate run started from its tool (`parent_run_id` set by the capability).
- fx-pruned: three tool cycles on a store with `max_snapshots_per_run=2`.
- fx-first-request-fails: `capture_frontier=True`, the first model request raises.
- fx-resumed-fails: continues fx-finished's history; its first model request raises.

The SQLite database also holds one conversation head (`SqliteConversationStore`) for `conv-shared`.

Older layouts (`*-pre-state`): `SqliteStepStore._ensure_schema` adds, to a database it finds without
them, the snapshot `state` column, `idempotency_key` on events and snapshots and `registration_id`
on runs, then creates `snapshot_idempotency_keys`, the message tables and their triggers. A
database from before those existed has the 0.62.0 tables minus all of that, with each snapshot's
history inline as a JSON list in `snapshots.messages`. `harness-pre-state.db` is built with that DDL
(`PRE_STATE_SQLITE_SCHEMA` in `pre_state.py`) and filled with the rows of two real runs the reference wrote to a
scratch database, minus the missing columns, keeping only their `complete` snapshots (an older
release wrote no other kind) with the history the reference rebuilds inline. No store opens it
afterwards, so it stays unmigrated; a copy of it is then opened with the reference store to check
that it migrates and reads back the same runs. `store-pre-state/` is the file-store counterpart:
run files without `registration_id`, events and snapshots without `idempotency_key`, snapshots
without `state`, and no `snapshot-keys.jsonl`, all keys the reference's reader treats as optional.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import json
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from pre_state import copy_to_pre_state_files, copy_to_pre_state_sqlite, verify_pre_state, write_pre_state_sources
from pydantic_ai_harness.step_persistence import FileStepStore, SqliteStepStore
from readback import file_stored, media_sizes_file, media_sizes_sqlite, read_back, sqlite_stored
from scenarios import MEDIA_BYTES, run_crashed_in_child, write_conversation_head, write_scenarios

REFERENCE_VERSION = '0.62.0'
RELEASE = importlib.metadata.version('pydantic-ai-harness')
REFERENCE = f'pydantic-ai-harness=={RELEASE}'
ROOT = Path(__file__).resolve().parents[2]
SQLITE_OUT = ROOT / 'packages/step-sqlite/tests/fixtures/harness'
FILE_OUT = ROOT / 'packages/step-file/tests/fixtures/harness'
PAGE_SIZE = 1024
"""The smallest SQLite page size, set on the finished files only to keep them small; it changes no content."""


def settle_sqlite(database: Path) -> None:
    """Fold the WAL into the file and leave it in rollback-journal mode, so the fixture is one file."""
    gc.collect()  # connections left in reference cycles still hold the database open until collected
    conn = sqlite3.connect(database, isolation_level=None)
    try:
        conn.execute('PRAGMA wal_checkpoint(TRUNCATE)').fetchall()
        conn.execute('PRAGMA journal_mode=DELETE').fetchall()
        conn.execute(f'PRAGMA page_size={PAGE_SIZE}')
        conn.execute('VACUUM')
    finally:
        conn.close()
    for suffix in ('-wal', '-shm'):
        Path(f'{database}{suffix}').unlink(missing_ok=True)


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + '\n')


def release_suffix() -> str:
    """'' for the reference release's fixtures, '-<version>' for an earlier release's."""
    return '' if RELEASE == REFERENCE_VERSION else f'-{RELEASE}'


async def make_sqlite(scratch: Path) -> None:
    SQLITE_OUT.mkdir(parents=True, exist_ok=True)
    suffix = release_suffix()
    database = SQLITE_OUT / f'harness{suffix}.db'
    for leftover in ('', '-wal', '-shm'):
        Path(f'{database}{leftover}').unlink(missing_ok=True)
    store = SqliteStepStore(database=database)
    scenarios = await write_scenarios(
        store, SqliteStepStore(database=database, max_snapshots_per_run=2), 'sqlite', str(database)
    )
    runs = await read_back(
        store, scenarios, lambda run_id: sqlite_stored(database, run_id), media_sizes_sqlite(database)
    )
    second_turn = next(r['run_id'] for r in runs if r['scenario'] == 'conversation_turn_2')
    head = await write_conversation_head(database, store, second_turn)
    settle_sqlite(database)
    manifest: dict[str, Any] = {
        'written_by': REFERENCE,
        'generator': 'scripts/harness/make_fixtures.py',
        'database': database.name,
        'media_threshold_bytes': MEDIA_BYTES,
        'notes': [
            'Opening a database with a store writes to it (schema setup, WAL mode): copy it first.',
            'Timestamps and the message hashes covering them change when the fixtures are regenerated.',
            'seq values are the stored snapshots.seq of the retained rows; pruned rows leave gaps.',
        ],
        'runs': runs,
        'conversation_heads': [head],
    }
    if suffix:
        write_manifest(SQLITE_OUT / f'manifest{suffix}.json', manifest)
        return

    source = scratch / 'pre-state-source.db'
    source_store = SqliteStepStore(database=source)
    await write_pre_state_sources(source_store)
    legacy = SQLITE_OUT / 'harness-pre-state.db'
    copy_to_pre_state_sqlite(source, legacy, page_size=PAGE_SIZE)
    probe = scratch / 'pre-state-probe.db'
    shutil.copy(legacy, probe)
    legacy_runs = await verify_pre_state(source_store, SqliteStepStore(database=probe))
    with sqlite3.connect(probe) as conn:
        migrated_columns = {
            table: [row[1] for row in conn.execute(f'PRAGMA table_info({table})')]
            for table in ('runs', 'events', 'snapshots')
        }
    write_manifest(
        SQLITE_OUT / 'manifest.json',
        {
            **manifest,
            'pre_state': {
                'database': 'harness-pre-state.db',
                'layout': (
                    'runs without registration_id; events without idempotency_key; snapshots without state and '
                    'idempotency_key, messages holding the history inline as a JSON list; no '
                    'snapshot_idempotency_keys, snapshot_messages, snapshot_message_refs, media tables, no triggers'
                ),
                'columns_after_reference_migration': migrated_columns,
                'runs': legacy_runs,
            },
        },
    )


async def make_file(scratch: Path) -> None:
    FILE_OUT.mkdir(parents=True, exist_ok=True)
    suffix = release_suffix()
    directory = FILE_OUT / f'store{suffix}'
    shutil.rmtree(directory, ignore_errors=True)
    store = FileStepStore(directory)
    scenarios = await write_scenarios(store, FileStepStore(directory, max_snapshots_per_run=2), 'file', str(directory))
    runs = await read_back(store, scenarios, lambda run_id: file_stored(directory, run_id), media_sizes_file(directory))
    manifest: dict[str, Any] = {
        'written_by': REFERENCE,
        'generator': 'scripts/harness/make_fixtures.py',
        'directory': directory.name,
        'media_threshold_bytes': MEDIA_BYTES,
        'notes': [
            'Opening the directory with a store may write to it: copy it first.',
            'Timestamps change when the fixtures are regenerated.',
            'seq values are the snapshots/<seq>.json names of the retained files; pruned files leave gaps.',
            'media/<sha256>.bin holds each externalized payload once.',
        ],
        'runs': runs,
    }
    if suffix:
        write_manifest(FILE_OUT / f'manifest{suffix}.json', manifest)
        return

    source = scratch / 'pre-state-source'
    source_store = FileStepStore(source)
    await write_pre_state_sources(source_store)
    legacy = FILE_OUT / 'store-pre-state'
    copy_to_pre_state_files(source, legacy)
    legacy_runs = await verify_pre_state(source_store, FileStepStore(legacy))
    write_manifest(
        FILE_OUT / 'manifest.json',
        {
            **manifest,
            'pre_state': {
                'directory': 'store-pre-state',
                'layout': (
                    'run.json without registration_id; events without idempotency_key; snapshots without state and '
                    'idempotency_key, only complete ones, renumbered from 0; no snapshot-keys.jsonl; no media'
                ),
                'runs': legacy_runs,
            },
        },
    )


async def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        await make_sqlite(Path(scratch))
        await make_file(Path(scratch))


if __name__ == '__main__':
    if sys.argv[1:2] == ['--crash-child']:
        asyncio.run(run_crashed_in_child(sys.argv[2], sys.argv[3]))
        raise SystemExit('the crash child should have been killed inside its tool')
    asyncio.run(main())
