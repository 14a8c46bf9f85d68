"""Fixtures for the step-postgres tests: a real server reached by `STEP_POSTGRES_URL` only.

Without the variable, or with a server that does not answer, every test fails (never skips):
start one with `export STEP_POSTGRES_URL="$(scripts/postgres-server.sh start)"`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import LiteralString, TypeAlias

import psycopg
import pytest
from psycopg import sql

from step_postgres import PostgresStepStore
from step_postgres.schema import redact_dsn
from stepcore import StepStore

START_HINT = 'start a server with: export STEP_POSTGRES_URL="$(scripts/postgres-server.sh start)"'


@pytest.fixture(scope='session')
def postgres_url() -> str:
    """The server URL from `STEP_POSTGRES_URL`, checked to answer."""
    url = os.environ.get('STEP_POSTGRES_URL', '').strip()
    if not url:
        pytest.fail(f'STEP_POSTGRES_URL is not set; the step-postgres tests need a real server: {START_HINT}')
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            conn.execute('SELECT 1')
    except psycopg.Error as exc:
        pytest.fail(f'cannot reach PostgreSQL at STEP_POSTGRES_URL={redact_dsn(url)}: {exc}; {START_HINT}')
    return url


def drop_prefix(url: str, prefix: str) -> None:
    """Drop every table, sequence and domain named `<prefix>_*` in the current schema."""
    pattern = prefix.replace('_', r'\_') + r'\_%'
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            """SELECT c.relname, c.relkind FROM pg_class c
            WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'S')
            AND c.relname LIKE %s""",
            (pattern,),
        ).fetchall()
        for name, kind in sorted(rows, key=lambda r: r[1] != 'r'):  # tables first, then sequences
            keyword = sql.SQL('TABLE' if kind == 'r' else 'SEQUENCE')
            conn.execute(sql.SQL('DROP {} IF EXISTS {} CASCADE').format(keyword, sql.Identifier(name)))
        domains = conn.execute(
            """SELECT typname FROM pg_type
            WHERE typnamespace = current_schema()::regnamespace AND typtype = 'd' AND typname LIKE %s""",
            (pattern,),
        ).fetchall()
        for (name,) in domains:  # the leases' fence domain
            conn.execute(sql.SQL('DROP DOMAIN IF EXISTS {} CASCADE').format(sql.Identifier(name)))


@pytest.fixture
def new_prefix(postgres_url: str) -> Iterator[Callable[[], str]]:
    """Makes fresh table prefixes for one test; their tables are dropped afterwards."""
    made: list[str] = []

    def make() -> str:
        made.append(f't_{uuid.uuid4().hex[:16]}')
        return made[-1]

    yield make
    for prefix in made:
        drop_prefix(postgres_url, prefix)


@pytest.fixture
def table_prefix(new_prefix: Callable[[], str]) -> str:
    """A fresh table prefix for one test; its tables are dropped afterwards."""
    return new_prefix()


Damage: TypeAlias = Callable[[StepStore, str, str, int | str | None, bytes], Awaitable[None]]
"""The kit's `damage` hook: `(store, kind, run_id, ident, replacement)`."""


_DAMAGE: dict[str, LiteralString] = {
    'run': 'UPDATE {runs} SET record = %s::json WHERE run_id = %s',
    'event': 'UPDATE {events} SET record = %s::json WHERE run_id = %s AND seq = %s',
    'effect': 'UPDATE {tool_effects} SET record = %s::json WHERE run_id = %s AND tool_call_id = %s',
    'snapshot': 'UPDATE {snapshots} SET record = %s::json WHERE run_id = %s AND seq = %s',
    'message': 'UPDATE {nodes} SET body = %s WHERE run_id = %s AND position(%s::bytea IN body) > 0',
}


@pytest.fixture
def postgres_damage(postgres_url: str) -> Damage:
    """Overwrites the stored body of records in the store's tables, bypassing the store.

    Records keep their bodies in `json` columns (the replacement is written as that JSON); message
    bodies are `bytea` node rows, each replaced whole when it contains the marker text.
    """

    async def damage(store: StepStore, kind: str, run_id: str, ident: int | str | None, replacement: bytes) -> None:
        assert isinstance(store, PostgresStepStore)
        if kind == 'message':
            params: tuple[object, ...] = (replacement, run_id, str(ident).encode())
        else:
            params = (replacement.decode(), run_id, *(() if ident is None else (ident,)))
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
            cursor = await conn.execute(store.tables.query(_DAMAGE[kind]), params)
            assert cursor.rowcount >= 1, f'no stored {kind} {ident!r} of run {run_id!r} to damage'

    return damage
