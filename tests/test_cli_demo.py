"""`stepcore demo` end to end, as a user runs it: a real child process killed with SIGKILL."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from stepcore.cli import app


def _demo(database: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ('COLUMNS', 'LINES', 'FORCE_COLOR', 'STEPCORE_STORE')}
    return subprocess.run(
        [sys.executable, '-m', 'stepcore.cli', 'demo', '--database', str(database)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_demo_kills_inspects_and_resumes(tmp_path: Path) -> None:
    database = tmp_path / 'demo.db'
    first = _demo(database, tmp_path)
    assert first.returncode == 0, first.stderr
    out = first.stdout
    # stage by stage, in order
    markers = [
        'child | researcher looked up',
        'child | wrote weekly-report.md',
        'child | sent email to team@example.com',
        'parent: sent SIGKILL to the child (exit code -9)',
        '2. The run tree',
        '└── report-run-1.research  [researcher]  completed',
        '3. The event trail',
        'tool_call_started',
        '5. The tool-effect ledger',
        'Outbox on disk: 1 email(s) sent.',
        'send_email (call-email) started, args',
        '7. Resume',
        'resumed | reconciled send_email (call-email): the outbox holds',
        'send_email (call-email) settled: reconciled',
        'assistant: The weekly report is written and was emailed to team@example.com.',
        'Unresolved tool calls in either run: 0. Outbox: 1 email(s) sent.',
        f'stepcore tree report-run-1 --store sqlite:///{database}',
        f'stepcore ui --store sqlite:///{database} --open',
    ]
    positions = [out.find(m) for m in markers]
    assert all(p >= 0 for p in positions), [m for m, p in zip(markers, positions, strict=True) if p < 0]
    assert positions == sorted(positions)
    assert 'Traceback' not in first.stderr
    assert '\x1b[' not in out  # no colour codes when stdout is not a terminal

    # what the demo left behind is a real database the other commands read
    with sqlite3.connect(database) as conn:
        assert conn.execute('pragma integrity_check').fetchone() == ('ok',)
    files = tmp_path / 'demo-files'
    assert (files / 'weekly-report.md').read_text().startswith('# Weekly report')
    assert (files / 'export-times.png').read_bytes().startswith(b'\x89PNG')
    outbox = [json.loads(line) for line in (files / 'outbox.jsonl').read_text().splitlines()]
    assert [m['to'] for m in outbox] == ['team@example.com']  # sent exactly once across crash and resume
    result = CliRunner().invoke(app, ['effects', 'report-run-1', '--json', '-s', f'sqlite:///{database}'])
    assert result.exit_code == 0, result.stderr
    [email] = [e for e in json.loads(result.stdout) if e['tool_name'] == 'send_email']
    assert email['status'] == 'completed'
    assert email['effect_summary'] == "email 'Weekly report' to team@example.com [settled on recovery: reconciled]"

    # a second run starts fresh and prints exactly the same thing
    second = _demo(database, tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout == out


def test_demo_refuses_to_replace_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    precious = tmp_path / 'notes.db'
    precious.write_text('my notes')
    result = CliRunner().invoke(app, ['demo', '--database', str(precious)])
    assert result.exit_code == 1
    assert 'exists and is not a SQLite database' in result.stderr
    assert precious.read_text() == 'my notes'
