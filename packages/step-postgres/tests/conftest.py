"""Fixtures for the step-postgres tests: a real server reached by `STEP_POSTGRES_URL` only.

Without the variable, or with a server that does not answer, every test fails (never skips):
start one with `export STEP_POSTGRES_URL="$(scripts/postgres-server.sh start)"`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from step_postgres.schema import redact_dsn

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
    """Drop every table and sequence named `<prefix>_*` in the current schema."""
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
