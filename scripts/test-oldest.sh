#!/usr/bin/env bash
# Run the tests that depend on pydantic-ai against the oldest pydantic-ai release stepcore supports.
#
#   scripts/test-oldest.sh [pytest args...]
#
# The workspace's own environment (`uv sync`) has the newest supported pydantic-ai; this script
# builds a second virtualenv (.venv-oldest, or $STEPCORE_OLDEST_VENV) holding every workspace
# package in editable mode with `pydantic-ai-slim` forced to the lower bound that
# packages/stepcore/pyproject.toml declares (or $STEPCORE_PYDANTIC_AI, to try another release),
# and runs pytest there on the selection below. Extra arguments are added to it (-x, -k EXPR; a
# path runs beside the selection). Everything else is pinned as in the root pyproject.toml.
#
# It needs the test servers that scripts/test.sh starts (STEP_POSTGRES_URL, STEP_MONGO_URL,
# STEP_S3_ENDPOINT); scripts/test.sh calls it once the main run passed.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=$(bash scripts/ensure-uv.sh)

oldest=$(sed -n 's/^ *"pydantic-ai-slim>=\([0-9][0-9.]*\),.*/\1/p' packages/stepcore/pyproject.toml)
if [ -z "$oldest" ]; then
    echo "test-oldest: no 'pydantic-ai-slim>=X,<Y' requirement found in packages/stepcore/pyproject.toml" >&2
    exit 1
fi
version=${STEPCORE_PYDANTIC_AI:-$oldest}
venv=${STEPCORE_OLDEST_VENV:-.venv-oldest}
work=$(mktemp -d -t stepcore-oldest.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The root pyproject's pins and dev tools, minus pydantic-ai (and the graph library released with it).
python3 - "$version" "$work" <<'PY'
import sys
import tomllib
from pathlib import Path

version, work = sys.argv[1], Path(sys.argv[2])
root = tomllib.loads(Path('pyproject.toml').read_text(encoding='utf-8'))
ours = ('pydantic-ai-slim', 'pydantic-graph')
pins = [c for c in root['tool']['uv']['constraint-dependencies'] if not c.startswith(ours)]
(work / 'constraints.txt').write_text('\n'.join(pins) + '\n', encoding='utf-8')
members = [p for p in sorted(Path('packages').iterdir()) if (p / 'pyproject.toml').exists()]
members.append(Path('tests-shared'))
projects = {m: tomllib.loads((m / 'pyproject.toml').read_text(encoding='utf-8')) for m in members}
names = {project['project']['name'] for project in projects.values()}
skip = ('pydantic-ai-slim', 'ruff', 'pyright', *names)

def third_party(requirements: list[str]) -> list[str]:
    return [r for r in requirements if not r.startswith(skip)]

# Dev tools of the root and of every member (the web inspector's browser driver, for one).
tools = third_party(root['dependency-groups']['dev'])
for project in projects.values():
    tools += third_party(project.get('dependency-groups', {}).get('dev', []))
# Each member with every extra it declares, as `uv sync --all-extras` installs them.
editables = []
for m, project in projects.items():
    extras = sorted(project['project'].get('optional-dependencies', {}))
    editables.append(f'-e {m}[{",".join(extras)}]' if extras else f'-e {m}')
lines = [f'pydantic-ai-slim[dbos]=={version}', *dict.fromkeys(tools), *editables]
(work / 'requirements.txt').write_text('\n'.join(lines) + '\n', encoding='utf-8')
PY

echo "test-oldest: pydantic-ai-slim $version in $venv"
"$UV" venv --quiet --clear --python 3.11 "$venv"
"$UV" pip install --quiet --no-config --python "$venv/bin/python" --constraint "$work/constraints.txt" \
    --requirement "$work/requirements.txt"
"$venv/bin/python" - "$version" <<'PY'
import importlib.metadata
import sys

def release(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in text.split('.')]
    return tuple(parts + [0] * (3 - len(parts)))

installed = importlib.metadata.version('pydantic-ai-slim')
if release(installed) != release(sys.argv[1]):
    sys.exit(f'test-oldest: expected pydantic-ai-slim {sys.argv[1]}, the environment has {installed}')
PY

# What changes with the pydantic-ai release is what stepcore does with pydantic-ai: the capability's
# hooks around a real Agent run, the message codec, resuming and recovery, and the conformance kit,
# whose capability section drives an Agent through each store. So this runs:
#   - the whole core package's tests: the capability, its crash rule, DBOS, recovery, the message
#     codec, history and media walking (most of its tests build or store pydantic-ai messages, the
#     rest take seconds), so new core tests are included without editing this list;
#   - the kit on the in-memory store (tests-shared/tests) and on SQLite, with SQLite's own tests of
#     agent runs, conversation parity with pydantic-ai-harness and reading a harness database;
#   - the workspace tests that drive agents or convert messages: capability scenarios, parity with
#     the reference, resolving killed runs (and resumptions killed in turn), listing and pruning
#     agent runs, the harness importer, and the Python examples of the README and the docs as a
#     user of that release would run them.
# Left to the newest release only: the server backends (PostgreSQL, MongoDB, Redis, S3), the file
# store, media on disk, the CLI's URL handling and plugin listing, the web inspector and the docs
# site build. They store bytes the core already encoded and call no pydantic-ai API of their own.
# Explicit paths cannot silently select nothing: a path that no longer exists is a pytest usage
# error (exit 4) and an empty selection exits 5, and either fails this script.
selection=(
    packages/stepcore/tests
    tests-shared/tests
    packages/step-sqlite/tests/test_conformance.py
    packages/step-sqlite/tests/test_agent.py
    packages/step-sqlite/tests/test_conversation_parity.py
    packages/step-sqlite/tests/test_harness_open.py
    tests/test_resolution.py
    tests/test_resumption_chains.py
    tests/test_capability_scenarios.py
    tests/test_reference_parity_capability.py
    tests/test_lifecycle.py
    tests/test_import_harness.py
    tests/test_readme.py
    tests/test_docs.py::test_python_examples_run
)
"$venv/bin/python" -m pytest -p no:cacheprovider -n "${STEPCORE_TEST_WORKERS:-2}" --dist loadfile "${selection[@]}" "$@"
