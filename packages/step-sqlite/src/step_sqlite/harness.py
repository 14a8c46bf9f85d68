"""Opening a database written by pydantic-ai-harness: migrated in place, after a backup beside it.

`SqliteStepStore(database=path)` on a file that holds the harness's step tables (any release from
0.52 to 0.62, and the earlier layout without the snapshot `state` column) converts it to
stepcore's layout the first time the store uses it:

1. take the database's write lock (`BEGIN IMMEDIATE`): no other writer, harness or stepcore, can
   change it until this ends, and a second store opening it meanwhile waits, then finds it done;
2. copy it, as it is now, to `<file>.harness-backup` beside it (`.harness-backup.1`, `.2`, ...
   when that name is taken: a backup is never overwritten), through a read-only connection and
   `VACUUM INTO` a temporary file that is synced, made owner-only and then linked into place;
3. in the same transaction: rename the harness tables aside (`harness_runs`, ...), create
   stepcore's tables, copy every media blob, write every run through the store itself
   (`stepcore.harness.import_harness` over this connection), drop the renamed tables, commit.

A process killed at any point leaves the backup as it was written, and the database either as the
harness left it (before the commit: SQLite rolls the transaction back) or migrated (after it).
Opening it again migrates it then, with a new backup.

Payloads the harness externalized go to this database's `media` table when the store uses its
default media store, and stay inline in the messages otherwise, so the store reads them whatever
its media store is; every blob of the harness's `media` table is kept in stepcore's. Keys of
snapshots the harness pruned and its conversation heads (the `conversations` table, left as it
is) are not migrated.

When the database cannot be migrated (no file to back up beside, a transaction of the caller's
open, a backup that cannot be written), opening it raises a `ValueError` naming
`stepcore import --from-harness`, which copies its runs into another store instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from stepcore.backend import (
    HarnessImportSummary,
    HarnessSqliteSource,
    StepStore,
    fsync_dir,
    import_harness,
    is_harness_sqlite,
    utcnow,
)

from .connection import Database, Guard
from .harness_tables import HARNESS_TABLES, describe_foreign_tables
from .schema import STEPS, ensure_schema, media_component, read_version

__all__ = ('BACKUP_SUFFIX', 'describe_foreign_tables', 'migrate_harness_database', 'write_backup')

T = TypeVar('T')

logger = logging.getLogger(__name__)

ASIDE = 'harness_'
"""Prefix of a harness table while its rows are copied."""
BACKUP_SUFFIX = '.harness-backup'


def _refusal(where: str, path: Path | None, reason: str) -> ValueError:
    source = str(path) if path is not None else 'PATH'
    return ValueError(
        f'{where} was written by pydantic-ai-harness and cannot be migrated to stepcore in place: {reason}. '
        f'Copy its runs into a stepcore store instead: stepcore import --from-harness {source} --store URL'
    )


def _database_file(connection: sqlite3.Connection) -> Path | None:
    """The main database's file, `None` for an in-memory or temporary one."""
    for _, name, file in connection.execute('PRAGMA database_list'):
        if name == 'main':
            return Path(file) if file else None
    return None  # pragma: no cover - every connection has a main database


def _tables(connection: sqlite3.Connection) -> set[str]:
    return {str(row[0]) for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def write_backup(path: Path, *, timeout: float) -> Path:
    """Copy the committed state of the database at `path` to a new backup file beside it.

    The copy is a self-contained database in rollback-journal mode, readable by its owner only.
    Returns its path; an existing backup is never replaced.
    """
    directory = path.parent
    for stale in directory.glob(f'.{path.name}{BACKUP_SUFFIX}-*.tmp'):
        stale.unlink(missing_ok=True)  # left by a migration killed while copying (it held the lock we hold now)
    partial = directory / f'.{path.name}{BACKUP_SUFFIX}-{uuid.uuid4().hex}.tmp'
    reader = sqlite3.connect(f'{path.resolve().as_uri()}?mode=ro', uri=True, timeout=timeout, isolation_level=None)
    try:
        reader.execute('VACUUM INTO ?', (str(partial),))
    finally:
        reader.close()
    try:
        os.chmod(partial, 0o600)
        fd = os.open(partial, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        number = 0
        while True:
            target = path.with_name(f'{path.name}{BACKUP_SUFFIX}' + (f'.{number}' if number else ''))
            try:
                os.link(partial, target)  # never replaces a file that is there
            except FileExistsError:
                number += 1
                continue
            break
    finally:
        partial.unlink(missing_ok=True)
    fsync_dir(directory)
    return target


class _ThisThread(Database):
    """The migrating connection as a `Database` whose calls run right here.

    The migration runs inside the connection's own setup, on its thread and holding its lock, so
    the stores writing the migrated runs must not hand their work to that thread again.
    """

    def __init__(self, connection: sqlite3.Connection, *, describe: str) -> None:
        # The guard's thread is never started: every call runs right here.
        super().__init__(
            Guard(connection), owner='harness migration', path=None, owned=False, describe=describe, timeout=0.0
        )
        self._here = connection

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        for name, setup in self._setups.items():
            if name not in self._ready:
                setup(self._here)
                self._ready.add(name)
        return work(self._here)

    def share(self, owner: str) -> Database:
        return self

    async def aclose(self) -> None:
        return None


def _copy_media(connection: sqlite3.Connection) -> None:
    """Every blob of the harness's media table into stepcore's (same digests: both are sha256)."""
    old = f'{ASIDE}media'
    if old not in _tables(connection):
        return
    columns = {str(row[1]) for row in connection.execute(f'PRAGMA table_info("{old}")')}
    media_type = 'media_type' if 'media_type' in columns else 'NULL'
    metadata = 'metadata' if 'metadata' in columns else 'NULL'
    now = utcnow()
    # Copied now: a blob no imported run references is collectable once the grace period passes.
    connection.execute(
        'INSERT OR IGNORE INTO media (digest, data, size, media_type, metadata, created_at, stored_us) '
        f'SELECT sha256, bytes, length(bytes), {media_type}, {metadata}, ?, ? FROM "{old}"',
        (now.isoformat(), int(now.timestamp() * 1_000_000)),
    )


def _migrate(
    connection: sqlite3.Connection, *, where: str, store_on: Callable[[Database], StepStore]
) -> HarnessImportSummary:
    """Replace the harness tables by stepcore's holding the same runs (inside the caller's transaction)."""
    present = _tables(connection)
    for table in HARNESS_TABLES:
        if table in present:
            connection.execute(f'ALTER TABLE "{table}" RENAME TO "{ASIDE}{table}"')
    ensure_schema(connection, STEPS, where=where)
    ensure_schema(connection, media_component('media'), where=where)
    _copy_media(connection)
    here = _ThisThread(connection, describe=where)
    store = store_on(here)
    source = HarnessSqliteSource(connection, where=where, prefix=ASIDE)
    # A loop of its own, not installed as the thread's: the stores' calls all run right here.
    loop = asyncio.new_event_loop()
    try:
        summary = loop.run_until_complete(import_harness(source, store))
    finally:
        loop.close()
    for table in HARNESS_TABLES:
        if table in present:
            connection.execute(f'DROP TABLE "{ASIDE}{table}"')
    return summary


def migrate_harness_database(
    connection: sqlite3.Connection, *, where: str, store_on: Callable[[Database], StepStore], timeout: float
) -> None:
    """Migrate the database in place when pydantic-ai-harness wrote it; do nothing otherwise.

    The runs are written by `store_on(database)`: the step store the database is being opened
    for, on the migrating connection (its media options decide where large payloads go). Raises
    `ValueError` when the database cannot be migrated.
    """
    if read_version(connection, STEPS.name) is not None or not is_harness_sqlite(connection):
        return
    path = _database_file(connection)
    if path is None:
        raise _refusal(where, None, 'it has no file to write a backup beside (an in-memory or temporary database)')
    if connection.in_transaction:
        raise _refusal(where, path, 'its connection has a transaction open; commit it, then open the store again')
    connection.execute('BEGIN IMMEDIATE')
    try:
        if read_version(connection, STEPS.name) is not None or not is_harness_sqlite(connection):
            connection.rollback()  # another process migrated it while this one waited for the lock
            return
        present = _tables(connection)
        taken = sorted(f'{ASIDE}{t}' for t in HARNESS_TABLES if f'{ASIDE}{t}' in present)
        if taken:
            raise _refusal(where, path, f'it already has table(s) {", ".join(taken)}, where its tables would go')
        try:
            backup = write_backup(path, timeout=timeout)
        except (OSError, sqlite3.Error) as error:
            raise _refusal(where, path, f'the backup copy could not be written ({error})') from error
        try:
            summary = _migrate(connection, where=where, store_on=store_on)
        except sqlite3.Error as error:
            raise _refusal(where, path, f'converting it failed ({error}); it was left as it was') from error
        connection.commit()
    except BaseException:
        if connection.in_transaction:
            connection.rollback()
        raise
    left_out = f'; left out (still in the backup): {"; ".join(summary.skipped)}' if summary.skipped else ''
    logger.warning(
        'migrated %s from pydantic-ai-harness to stepcore (%d runs, %d snapshots, %d events, %d ledger entries); '
        'the original is kept at %s%s',
        where,
        len(summary.imported),
        summary.snapshots,
        summary.events,
        summary.tool_effects,
        backup,
        left_out,
    )
