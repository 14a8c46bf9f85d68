"""`stepcore plugins` lists every installed distribution's backends."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from stepcore.cli import app
from stepcore.features import MEDIA_EXTERNALIZATION, PERSISTENT, SNAPSHOT_RETENTION

OURS = {
    'stepcore': {('step', 'memory')},
    'step-file': {('step', 'file')},
    'step-sqlite': {('step', 'sqlite'), ('media', 'sqlite')},
    'step-mongo': {('step', 'mongo'), ('media', 'mongo')},
    'media-disk': {('media', 'disk')},
    'media-s3': {('media', 's3')},
}


def _backends(rows: list[dict[str, Any]]) -> dict[str, set[tuple[str, str]]]:
    return {row['distribution']: {(b['kind'], b['key']) for b in row['backends']} for row in rows}


def test_plugins_json_lists_all_six_distributions() -> None:
    result = CliRunner().invoke(app, ['plugins', '--json'])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    backends = _backends(rows)
    for distribution, expected in OURS.items():
        assert backends.get(distribution) == expected, f'{distribution}: {backends.get(distribution)}'
    by_key = {(b['kind'], b['key']): b for row in rows for b in row['backends']}
    assert by_key[('step', 'memory')]['features'] == [SNAPSHOT_RETENTION]
    assert set(by_key[('step', 'sqlite')]['features']) == {SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT}
    for row in rows:
        assert row['version'] not in ('', 'unknown'), row
        for backend in row['backends']:
            assert backend['summary'], backend


def test_plugins_table_names_every_backend() -> None:
    result = CliRunner().invoke(app, ['plugins'], env={'COLUMNS': '200'})
    assert result.exit_code == 0, result.output
    for distribution in OURS:
        assert distribution in result.stdout
