"""Versioned table layouts and their in-place migrations.

Each component (the step tables, a media table) records its layout version in the
`stepcore_schema` table, not in `PRAGMA user_version`, so a database shared with an application
that versions its own tables is left alone. Opening a database brings an older layout up to date
inside one write transaction; a layout newer than this release knows is refused.

A component is created by running its version-1 script and then every migration, so a fresh
database goes through exactly the steps an upgraded one does.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .connection import write_transaction
from .harness_tables import describe_foreign_tables

__all__ = (
    'IDENTITY',
    'LEASES',
    'STEPS',
    'Component',
    'SchemaDamaged',
    'ensure_schema',
    'media_component',
    'read_version',
)

SCHEMA_TABLE = 'stepcore_schema'

Migration = Callable[[sqlite3.Connection], None]


@dataclass(frozen=True, kw_only=True)
class Component:
    """A group of tables versioned together."""

    name: str
    create: Migration
    """Creates the version-1 layout."""
    migrations: Mapping[int, Migration]
    """`migrations[v]` takes the layout from version `v` to `v + 1`."""
    tables: Sequence[str]
    """Tables the component owns (used to recognise a foreign table of the same name)."""

    @property
    def version(self) -> int:
        """The layout version this release writes."""
        return 1 + len(self.migrations)


def _script(sql: str) -> Migration:
    statements = [s.strip() for s in sql.split(';') if s.strip()]

    def run(connection: sqlite3.Connection) -> None:
        for statement in statements:
            connection.execute(statement)

    return run


# -- step tables -----------------------------------------------------------------------------

_STEPS_V1 = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    conversation_id TEXT,
    parent_run_id TEXT,
    started_us INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX runs_started ON runs (started_us);
CREATE INDEX runs_conversation ON runs (conversation_id, started_us) WHERE conversation_id IS NOT NULL;
CREATE INDEX runs_parent ON runs (parent_run_id, started_us) WHERE parent_run_id IS NOT NULL;

CREATE TABLE events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    idempotency_key TEXT,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX events_idempotency ON events (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE message_nodes (
    node_id INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    parent_id INTEGER,
    body BLOB NOT NULL
);
CREATE INDEX message_nodes_run ON message_nodes (run_id);

CREATE TABLE snapshots (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    head INTEGER,
    length INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX snapshots_run ON snapshots (run_id, seq);

CREATE TABLE snapshot_idempotency_keys (
    run_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    PRIMARY KEY (run_id, idempotency_key)
) WITHOUT ROWID;

CREATE TABLE tool_effects (
    run_id TEXT NOT NULL,
    tool_call_id TEXT NOT NULL,
    status TEXT NOT NULL,
    started_us INTEGER NOT NULL,
    record TEXT NOT NULL,
    UNIQUE (run_id, tool_call_id)
);
CREATE INDEX tool_effects_run ON tool_effects (run_id, started_us);
CREATE INDEX tool_effects_status ON tool_effects (run_id, status, started_us)
"""

_STEPS_V1_TO_V2 = """
ALTER TABLE snapshots ADD COLUMN state TEXT NOT NULL DEFAULT 'complete';
CREATE INDEX snapshots_run_state ON snapshots (run_id, state, seq)
"""
"""Version 2: snapshots record whether they were complete or interrupted (old rows: complete)."""

_STEPS_V2_TO_V3 = """
CREATE TABLE node_ids (last INTEGER NOT NULL);
INSERT INTO node_ids (last) SELECT COALESCE(MAX(node_id), 0) FROM message_nodes
"""
"""Version 3: the highest message node id is remembered when a run is deleted, so the ids of a
deleted run's messages are never handed out again (a store remembering that run must not build on
them)."""

STEPS = Component(
    name='steps',
    create=_script(_STEPS_V1),
    migrations={1: _script(_STEPS_V1_TO_V2), 2: _script(_STEPS_V2_TO_V3)},
    tables=('runs', 'events', 'message_nodes', 'snapshots', 'snapshot_idempotency_keys', 'tool_effects', 'node_ids'),
)


_LEASES_V1 = """
CREATE TABLE run_leases (
    run_id TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL,
    state TEXT NOT NULL,
    host TEXT NOT NULL,
    expires REAL NOT NULL,
    body TEXT NOT NULL,
    start BLOB
);
CREATE INDEX run_leases_state ON run_leases (state, expires) WHERE state <> 'ended'
"""

LEASES = Component(name='leases', create=_script(_LEASES_V1), migrations={}, tables=('run_leases',))
"""Run ownership: one lease per run (see `stepcore.store.leases`), indexed by state for finding
orphans. A component of its own, so the step tables keep their version and an older step-sqlite
still opens a database that has leases."""


def _create_identity(connection: sqlite3.Connection) -> None:
    connection.execute('CREATE TABLE store_identity (one INTEGER PRIMARY KEY CHECK (one = 1), store_id TEXT NOT NULL)')
    connection.execute('INSERT INTO store_identity (one, store_id) VALUES (1, ?)', (uuid.uuid4().hex,))


IDENTITY = Component(name='identity', create=_create_identity, migrations={}, tables=('store_identity',))
"""The store's id (`stepcore.backend.ops.StoreIdentity`): one row, written with the table. A
component of its own, so a database made by an earlier release gets it when this release first opens
it, and an earlier release still opens a database that has it."""


# -- media table -----------------------------------------------------------------------------


def media_component(table: str) -> Component:
    """The layout of one media table (its name is a validated identifier)."""
    create = f"""
    CREATE TABLE {table} (
        digest TEXT PRIMARY KEY,
        data BLOB NOT NULL,
        size INTEGER NOT NULL,
        media_type TEXT,
        metadata TEXT,
        created_at TEXT NOT NULL
    )
    """

    # Version 2: when each blob was last put (microseconds since the epoch), for garbage
    # collection; a blob stored before it counts as put when it was created.
    def stored_at(connection: sqlite3.Connection) -> None:
        connection.execute(f'ALTER TABLE {table} ADD COLUMN stored_us INTEGER NOT NULL DEFAULT 0')
        rows = connection.execute(f'SELECT digest, created_at FROM {table}').fetchall()
        connection.executemany(
            f'UPDATE {table} SET stored_us = ? WHERE digest = ?',
            [(_epoch_us(created), digest) for digest, created in rows],
        )

    return Component(name=f'media:{table}', create=_script(create), migrations={1: stored_at}, tables=(table,))


def _epoch_us(iso: str) -> int:
    """Microseconds since the epoch of a stored ISO time (one without a zone is UTC); 0 if unreadable."""
    try:
        moment = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return 0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(microseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- applying --------------------------------------------------------------------------------


def read_version(connection: sqlite3.Connection, component: str) -> int | None:
    """The stored layout version of a component, `None` when it was never created."""
    exists = connection.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (SCHEMA_TABLE,)
    ).fetchone()
    if exists is None:
        return None
    row = connection.execute(f'SELECT version FROM {SCHEMA_TABLE} WHERE component = ?', (component,)).fetchone()
    return None if row is None else int(row[0])


def _refuse_newer(found: int, component: Component, where: str) -> ValueError:
    return ValueError(
        f'{where} holds {component.name!r} tables at schema version {found}, newer than this step-sqlite '
        f'supports (version {component.version}): upgrade step-sqlite (pip install -U step-sqlite) to open it, '
        'or use a different database file'
    )


class SchemaDamaged(ValueError):
    """The database's own description of step-sqlite's tables is damaged: its records cannot be read."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(
            f'the schema of {where} is damaged ({what}): its records cannot be read; run `stepcore check` '
            'on it, and restore the file from a backup'
        )


def ensure_schema(connection: sqlite3.Connection, component: Component, *, where: str) -> None:
    """Create the component's tables or migrate them to the current version; `SchemaDamaged` when
    the description of tables step-sqlite made no longer reads (a damaged `sqlite_master` or
    version table)."""
    try:
        _ensure_schema(connection, component, where=where)
    except sqlite3.OperationalError as error:
        text = str(error)
        if text.startswith(('no such column', 'no such table')) and _has_table(connection, SCHEMA_TABLE, where):
            raise SchemaDamaged(where, f'{SCHEMA_TABLE}: {text}') from error
        raise


def _has_table(connection: sqlite3.Connection, name: str, where: str) -> bool:
    try:
        found = connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return found.fetchone() is not None
    except sqlite3.DatabaseError as error:
        raise SchemaDamaged(where, str(error)) from error


def _ensure_schema(connection: sqlite3.Connection, component: Component, *, where: str) -> None:
    found = read_version(connection, component.name)
    if found == component.version:
        return
    if found is not None and found > component.version:
        raise _refuse_newer(found, component, where)
    with write_transaction(connection):
        versioned = _has_table(connection, SCHEMA_TABLE, where)
        connection.execute(
            f'CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (component TEXT PRIMARY KEY, version INTEGER NOT NULL)'
        )
        found = read_version(connection, component.name)  # another process may have done it meanwhile
        if found is None:
            placeholders = ', '.join('?' for _ in component.tables)
            clash = connection.execute(
                f"SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ({placeholders})",
                tuple(component.tables),
            ).fetchall()
            if clash:
                tables = sorted(str(r[0]) for r in clash)
                if set(tables) == set(component.tables) and (versioned or len(tables) > 1):
                    # every table step-sqlite makes for it is here and its version entry is not: a
                    # damaged version table (or a damaged name of it), not someone else's tables
                    raise SchemaDamaged(
                        where, f'no {SCHEMA_TABLE} entry for {component.name!r}, whose tables are all there'
                    )
                raise ValueError(
                    f'{where} already has table(s) {", ".join(tables)} that step-sqlite did not create (no '
                    f'{SCHEMA_TABLE} entry for {component.name!r}): use a different database file'
                    f'{describe_foreign_tables(connection, tables)}'
                )
            component.create(connection)
            found = 1
        if found > component.version:
            raise _refuse_newer(found, component, where)
        while found < component.version:
            component.migrations[found](connection)
            found += 1
        connection.execute(
            f'INSERT INTO {SCHEMA_TABLE} (component, version) VALUES (?, ?) '
            'ON CONFLICT (component) DO UPDATE SET version = excluded.version',
            (component.name, found),
        )
