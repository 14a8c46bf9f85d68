"""`rekey`: rewrite a store's runs under its active encryption key.

A run whose stored bodies are not all under the active key (written in clear, or under a key
being retired) is read whole with the keys the store holds, kept in a journal file encrypted with
the active key, deleted, and written again, and its journal file removed. A rekey stopped at any
point is resumed by running it again: runs left in the journal are written back first, and runs
already under the active key are skipped, so running it twice changes nothing more.

Event and snapshot `seq` numbers are given afresh (they stay the same unless snapshots were
pruned). Media blobs are written again under the active key; the blobs under the old key stay in
the media store until it is cleaned.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stepcore.backend_io import fsync_dir
from stepcore.cli.transfer import collect_run, dump_export, import_runs, parse_export
from stepcore.store.step_store import StepStore

__all__ = ('RekeyReport', 'rekey_store')

_JOURNAL_SUFFIX = '.rekey'


@dataclass
class RekeyReport:
    rewritten: list[str] = field(default_factory=list[str])
    """Runs written again under the active key (resumed ones included)."""
    skipped: int = 0
    """Runs already under the active key."""
    resumed: list[str] = field(default_factory=list[str])
    """Runs an interrupted rekey had left in the journal."""


def _journal_file(journal: Path, run_id: str) -> Path:
    return journal / f'{run_id.encode().hex()}{_JOURNAL_SUFFIX}'


async def _write_back(store: StepStore, entry: Path) -> str:
    encryption = store.encryption
    assert encryption is not None
    (export,) = parse_export(json.loads(encryption.open_blob(entry.read_bytes(), what=f'journal file {entry}')))
    run_id = export.run.run_id
    await store.delete_run(run_id)
    await import_runs(store, [export])
    entry.unlink()
    fsync_dir(entry.parent)
    return run_id


async def rekey_store(store: StepStore, journal: Path, *, progress: Callable[[str], None] | None = None) -> RekeyReport:
    """Rewrite every run of `store` not wholly under its active key (see the module docstring).

    `journal` is a folder of this store's own (created owner-only) that holds each run between
    its deletion and its rewrite, encrypted with the active key.
    """
    encryption = store.encryption
    if encryption is None:
        raise ValueError(
            'rekey needs the keys of the store: pass --keys-env VARIABLE or --key-file PATH (or '
            '?encryption_env=VARIABLE or ?encryption_key_file=PATH in the store URL), with the new key active '
            'and the old ones beside it'
        )
    journal.mkdir(mode=0o700, parents=True, exist_ok=True)
    report = RekeyReport()
    for entry in sorted(journal.glob(f'*{_JOURNAL_SUFFIX}')):
        run_id = await _write_back(store, entry)
        report.resumed.append(run_id)
        report.rewritten.append(run_id)
        if progress:
            progress(run_id)
    for run in await store.list_runs():
        run_id = run.run_id
        if await store.stored_key_ids(run_id) == {encryption.active}:
            report.skipped += 1
            continue
        export = await collect_run(store, run_id)
        entry = _journal_file(journal, run_id)
        temporary = entry.with_suffix('.tmp')
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, 'wb') as file:
            file.write(encryption.seal_blob(json.dumps(dump_export([export])).encode()))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, entry)
        fsync_dir(journal)
        await _write_back(store, entry)
        report.rewritten.append(run_id)
        if progress:
            progress(run_id)
    return report
