#!/usr/bin/env bash
# Test the template backend under examples/ the way its author would (docs/plugins.md, "Run the
# kit"): in a fresh virtual environment holding only what the documented install command installs,
# so its plugin never leaks into the workspace's registry. The command is the documented one, run
# with uv (which takes pip's arguments and reuses its cache), plus the workspace's version pins as
# constraints. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=$(bash scripts/ensure-uv.sh)
work=$(mktemp -d -t stepcore-example.XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 - "$work/constraints.txt" <<'PY'
import sys, tomllib
with open('pyproject.toml', 'rb') as f:
    pins = tomllib.load(f)['tool']['uv']['constraint-dependencies']
open(sys.argv[1], 'w').write('\n'.join(pins) + '\n')
PY
"$UV" venv --quiet --python 3.11 "$work/venv"
export VIRTUAL_ENV="$work/venv"
"$UV" pip install --quiet -c "$work/constraints.txt" \
    -e ./packages/stepcore -e ./packages/media-disk -e ./tests-shared -e './examples/stepcore-template[test]'
cd examples/stepcore-template
"$VIRTUAL_ENV/bin/pytest" -rs -p no:cacheprovider "$@"
