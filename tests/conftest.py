"""Fixtures shared by the workspace tests that run real processes on one store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(params=['sqlite', 'postgres'])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A store several processes share: a SQLite file of this test, or the test server's PostgreSQL
    database (shared by every test: give runs ids of their own)."""
    if request.param == 'sqlite':
        return {'backend': 'sqlite', 'database': str(tmp_path / 'runs.db')}
    url = os.environ.get('STEP_POSTGRES_URL')
    if not url:
        pytest.fail('STEP_POSTGRES_URL is not set: start the test servers (scripts/test.sh does)')
    return {'backend': 'postgres', 'dsn': url}


def spec_url(spec: dict[str, Any]) -> str:
    """The URL the command line reaches `spec`'s store by."""
    return f'sqlite:///{spec["database"]}' if spec['backend'] == 'sqlite' else spec['dsn']


@pytest.fixture
def store_url(spec: dict[str, Any]) -> str:
    """`spec_url(spec)`."""
    return spec_url(spec)
