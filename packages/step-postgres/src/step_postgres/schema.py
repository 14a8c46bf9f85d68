"""Table names, the versioned schema and its in-place migrations.

Every table a store uses is named `<table_prefix>_<name>`. The prefix is validated as a plain
lowercase identifier, and names reach SQL only through `psycopg.sql.Identifier`; values always
travel as query parameters.

Schema changes are numbered migrations per component (`steps` for the step store, `leases` for its
run leases, `identity` for the store's id, `media` for the media store), recorded in
`<prefix>_schema_version`. A store brings its component up to date when it first connects, inside
one transaction holding a transaction-scoped advisory lock derived from the prefix, so processes
that start together never race on `CREATE TABLE`, and a migration is applied completely or not at
all. A database whose recorded version is newer than this release knows is refused rather than
written to.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

from psycopg import AsyncConnection, sql
from psycopg.rows import tuple_row

__all__ = (
    'DEFAULT_TABLE_PREFIX',
    'IDENTITY',
    'LEASES',
    'MEDIA',
    'STEPS',
    'Component',
    'SchemaVersionError',
    'Tables',
    'advisory_key',
    'ensure_schema',
    'redact_dsn',
    'schema_version',
    'validate_table_prefix',
)

DEFAULT_TABLE_PREFIX = 'step_persistence'
_PREFIX_RE = re.compile(r'[a-z_][a-z0-9_]{0,40}')


class SchemaVersionError(RuntimeError):
    """The database holds a schema this release cannot use."""


def validate_table_prefix(prefix: object) -> str:
    """Return `prefix` when it is a valid table prefix, else raise `ValueError` saying why."""
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(
            f'table_prefix={prefix!r} is not a valid table prefix: use 1-41 characters of lowercase '
            'letters, digits and underscores, not starting with a digit (e.g. "step_persistence")'
        )
    return prefix


_TABLE_NAMES: tuple[LiteralString, ...] = (
    'schema_version',
    'runs',
    'counters',
    'events',
    'event_keys',
    'node_ids',
    'nodes',
    'snapshots',
    'snapshot_keys',
    'tool_effects',
    'runs_conversation',
    'runs_parent',
    'runs_started',
    'snapshots_state',
    'tool_effects_status',
    'nodes_run',
    'run_leases',
    'run_leases_state',
    'lease_held',
    'media',
    'store_identity',
)


@dataclass(frozen=True)
class Tables:
    """The SQL identifiers of one prefix's tables, indexes and sequences."""

    prefix: str

    def __post_init__(self) -> None:
        validate_table_prefix(self.prefix)

    def name(self, suffix: str) -> str:
        """The plain name of one object (`<prefix>_<suffix>`)."""
        return f'{self.prefix}_{suffix}'

    def identifiers(self) -> dict[str, sql.Identifier]:
        """`sql.Identifier` for every object name, keyed by its suffix."""
        return {suffix: sql.Identifier(self.name(suffix)) for suffix in _TABLE_NAMES}

    def query(self, template: LiteralString) -> sql.Composed:
        """`template` with `{runs}`-style placeholders replaced by quoted identifiers."""
        return sql.SQL(template).format(**self.identifiers())


@dataclass(frozen=True)
class Component:
    """A versioned part of the schema and the migrations that build it, oldest first."""

    name: str
    migrations: Sequence[Sequence[LiteralString]]
    """`migrations[i]` takes the component from version `i` to version `i + 1`."""

    @property
    def latest(self) -> int:
        return len(self.migrations)


STEPS = Component(
    name='steps',
    migrations=(
        # 1: the tables and the constraints the protocol relies on.
        (
            """CREATE TABLE {runs} (
                run_id text PRIMARY KEY,
                ord bigint GENERATED ALWAYS AS IDENTITY,
                started_at timestamptz NOT NULL,
                conversation_id text,
                parent_run_id text,
                registration_id text,
                record json NOT NULL
            )""",
            """CREATE TABLE {counters} (
                run_id text NOT NULL,
                kind text NOT NULL,
                value bigint NOT NULL,
                PRIMARY KEY (run_id, kind)
            )""",
            """CREATE TABLE {events} (
                run_id text NOT NULL,
                seq bigint NOT NULL,
                idempotency_key text,
                record json NOT NULL,
                PRIMARY KEY (run_id, seq)
            )""",
            """CREATE TABLE {event_keys} (
                run_id text NOT NULL,
                idempotency_key text NOT NULL,
                PRIMARY KEY (run_id, idempotency_key)
            )""",
            'CREATE SEQUENCE {node_ids} AS bigint',
            """CREATE TABLE {nodes} (
                node_id bigint PRIMARY KEY,
                run_id text NOT NULL,
                parent bigint,
                body bytea NOT NULL
            )""",
            # Dropping the node table drops its id sequence with it.
            'ALTER SEQUENCE {node_ids} OWNED BY {nodes}.node_id',
            """CREATE TABLE {snapshots} (
                run_id text NOT NULL,
                seq bigint NOT NULL,
                state text NOT NULL,
                step_index bigint NOT NULL,
                head bigint,
                length integer NOT NULL,
                record json NOT NULL,
                PRIMARY KEY (run_id, seq)
            )""",
            """CREATE TABLE {snapshot_keys} (
                run_id text NOT NULL,
                idempotency_key text NOT NULL,
                PRIMARY KEY (run_id, idempotency_key)
            )""",
            """CREATE TABLE {tool_effects} (
                run_id text NOT NULL,
                tool_call_id text NOT NULL,
                ord bigint GENERATED ALWAYS AS IDENTITY,
                status text NOT NULL,
                started_at timestamptz NOT NULL,
                record json NOT NULL,
                PRIMARY KEY (run_id, tool_call_id)
            )""",
        ),
        # 2: lookup indexes for the filtered and ordered listings.
        (
            """CREATE INDEX {runs_conversation} ON {runs} (conversation_id, started_at, ord)
                WHERE conversation_id IS NOT NULL""",
            """CREATE INDEX {runs_parent} ON {runs} (parent_run_id, started_at, ord)
                WHERE parent_run_id IS NOT NULL""",
            'CREATE INDEX {runs_started} ON {runs} (started_at, ord)',
            'CREATE INDEX {snapshots_state} ON {snapshots} (run_id, state, seq)',
            'CREATE INDEX {tool_effects_status} ON {tool_effects} (run_id, status, started_at, ord)',
        ),
        # 3: message nodes by run, so deleting a run does not scan every run's nodes. (An index an
        # operator built beforehand with CREATE INDEX CONCURRENTLY under this name is kept.)
        ('CREATE INDEX IF NOT EXISTS {nodes_run} ON {nodes} (run_id)',),
    ),
)

LEASES = Component(
    name='leases',
    migrations=(
        # 1: one lease per run (see `stepcore.store.leases`): `expires` in seconds since the Unix
        # epoch on the server's clock, `start` the run's start point; the live states indexed for
        # finding orphans. And the domain a write's fence casts its check to: a check that fails
        # is an error of the server's, which aborts the write's transaction without a round trip
        # of its own (`PostgresPort.check_lease`). A leftover domain of tables dropped by hand is
        # replaced (nothing else uses it).
        (
            """CREATE TABLE {run_leases} (
                run_id text PRIMARY KEY,
                epoch bigint NOT NULL,
                state text NOT NULL,
                host text NOT NULL,
                expires double precision NOT NULL,
                body json NOT NULL,
                start bytea
            )""",
            "CREATE INDEX {run_leases_state} ON {run_leases} (state, expires) WHERE state <> 'ended'",
            'DROP DOMAIN IF EXISTS {lease_held}',
            'CREATE DOMAIN {lease_held} AS boolean CONSTRAINT {lease_held} CHECK (VALUE IS TRUE)',
        ),
    ),
)
"""Run ownership: a component of its own, so the step tables keep their version and an older
step-postgres, which knows only `steps`, still opens a database that has leases."""

IDENTITY = Component(
    name='identity',
    migrations=(
        # 1: the store's id (`stepcore.backend.ops.StoreIdentity`): one row at most, inserted by the
        # first store that asks for it.
        (
            """CREATE TABLE {store_identity} (
                one boolean PRIMARY KEY DEFAULT true CHECK (one),
                store_id text NOT NULL
            )""",
        ),
    ),
)
"""The store's id: a component of its own, so the other components keep their versions and an
earlier step-postgres still opens a database that has it."""

MEDIA = Component(
    name='media',
    migrations=(
        (
            """CREATE TABLE {media} (
                digest text PRIMARY KEY,
                data bytea NOT NULL,
                media_type text,
                metadata json,
                created_at timestamptz NOT NULL DEFAULT now()
            )""",
            # Media is mostly compressed already (images, audio): store it out of line uncompressed.
            'ALTER TABLE {media} ALTER COLUMN data SET STORAGE EXTERNAL',
        ),
        # 2: when each blob was last put, for garbage collection (a blob stored before: its creation).
        (
            'ALTER TABLE {media} ADD COLUMN stored_at timestamptz',
            'UPDATE {media} SET stored_at = created_at',
            'ALTER TABLE {media} ALTER COLUMN stored_at SET NOT NULL',
        ),
    ),
)


def advisory_key(prefix: str) -> int:
    """The advisory lock key guarding schema changes of one prefix (a signed 64-bit integer)."""
    digest = hashlib.blake2b(f'step_postgres:schema:{prefix}'.encode(), digest_size=8).digest()
    return int.from_bytes(digest, 'big', signed=True)


async def schema_version(conn: AsyncConnection[Any], tables: Tables, component: Component) -> int:
    """The recorded version of `component` (0 when it was never created)."""
    cur = conn.cursor(row_factory=tuple_row)
    await cur.execute('SELECT to_regclass(%s) IS NOT NULL', (tables.name('schema_version'),))
    row = await cur.fetchone()
    if row is None or not row[0]:
        return 0
    await cur.execute(tables.query('SELECT version FROM {schema_version} WHERE component = %s'), (component.name,))
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


async def ensure_schema(
    conn: AsyncConnection[Any], tables: Tables, component: Component, *, target: int | None = None
) -> int:
    """Create or upgrade `component` to `target` (default: latest) in one locked transaction.

    Returns the version the database is at afterwards. Raises `SchemaVersionError` when the
    database records a version newer than this release knows.
    """
    goal = component.latest if target is None else target
    if not 0 <= goal <= component.latest:
        raise ValueError(f'target={target!r} is not a version of the {component.name!r} schema (0..{component.latest})')
    async with conn.transaction():
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute('SELECT pg_advisory_xact_lock(%s)', (advisory_key(tables.prefix),))
        await cur.execute(
            tables.query(
                """CREATE TABLE IF NOT EXISTS {schema_version} (
                    component text PRIMARY KEY,
                    version integer NOT NULL,
                    updated_at timestamptz NOT NULL DEFAULT now()
                )"""
            )
        )
        current = await schema_version(conn, tables, component)
        if current > component.latest:
            raise SchemaVersionError(
                f'tables with prefix {tables.prefix!r} hold {component.name} schema version {current}, newer than '
                f'this step-postgres supports (up to {component.latest}): upgrade step-postgres, or use another '
                'table_prefix'
            )
        for version in range(current, goal):
            for statement in component.migrations[version]:
                await cur.execute(tables.query(statement))
            await cur.execute(
                tables.query(
                    """INSERT INTO {schema_version} (component, version) VALUES (%s, %s)
                    ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version, updated_at = now()"""
                ),
                (component.name, version + 1),
            )
        return max(current, goal)


def redact_dsn(dsn: str) -> str:
    """`dsn` with any password replaced by `***`, for error messages."""
    redacted = re.sub(r'(://[^:/@]*:)[^@]*@', r'\1***@', dsn)
    return re.sub(r'(password\s*=\s*)(\'[^\']*\'|\S+)', r'\1***', redacted, flags=re.IGNORECASE)
