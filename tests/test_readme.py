"""The Python example in the root README runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / 'README.md'


def test_readme_example_runs(tmp_path: Path) -> None:
    pytest.importorskip('step_sqlite', reason='the README example uses the SQLite store (pip install step-sqlite)')
    blocks = re.findall(r'```python\n(.*?)```', README.read_text(), re.S)
    assert blocks, 'the README has no Python example'
    script = tmp_path / 'example.py'
    script.write_text(blocks[0])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith('success')
    assert (tmp_path / 'runs.db').exists()
