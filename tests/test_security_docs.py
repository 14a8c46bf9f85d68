"""docs/security.md's shell example runs as written: a key made, a store encrypted, read back by URL.

The Python examples of every page run in test_docs.py; this runs the page's bash block verbatim
in a fresh folder, with this environment's `python` and `stepcore` first on the PATH, as a reader
with the package installed would paste it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / 'docs' / 'security.md'
_BASH = re.compile(r'^```bash\n(.*?)^```\s*$', re.MULTILINE | re.DOTALL)


def _stepcore(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, '-m', 'stepcore.cli', *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_the_key_snippet_runs_verbatim_and_leaves_an_encrypted_store(tmp_path: Path) -> None:
    [snippet] = _BASH.findall(PAGE.read_text(encoding='utf-8'))
    script = tmp_path / 'snippet.sh'
    script.write_text(snippet, encoding='utf-8')
    env = {k: v for k, v in os.environ.items() if not k.startswith('STEPCORE_')}
    env['PATH'] = os.pathsep.join([str(Path(sys.executable).parent), env.get('PATH', '')])
    env['COLUMNS'] = '200'
    env['PYTHONIOENCODING'] = 'utf-8'
    done = subprocess.run(
        ['bash', '-euo', 'pipefail', str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 'rewrote 3 run(s) under the active key' in done.stderr
    # The last line lists the runs through the keys the URL names (under -e, a key error would fail it).
    assert done.stdout.rstrip().endswith('┘'), done.stdout[-2000:]
    # Without the key the store no longer reads: the rekey really encrypted it.
    keyless = _stepcore('runs', '--store', 'sqlite:///runs.db', cwd=tmp_path, env=env)
    assert keyless.returncode == 1
    assert "encrypted with key 'k1'" in keyless.stderr


def test_the_page_names_one_key_generator() -> None:
    text = PAGE.read_text(encoding='utf-8')
    assert 'Encryption.generate_key()' in text
    assert 'stepcore.generate_key' not in text
    assert re.findall(r'\b(?:os\.urandom|secrets\.token_bytes)\(', text) == []
