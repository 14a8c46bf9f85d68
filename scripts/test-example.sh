#!/usr/bin/env bash
# Test the worked third-party backend under examples/ the way its author would: in a virtual
# environment of its own holding only stepcore, stepcore-conformance and the example, so its
# plugin never leaks into the workspace's registry. Versions follow the workspace pins.
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
"$UV" pip install --quiet --python "$work/venv/bin/python" -c "$work/constraints.txt" \
    -e packages/stepcore -e tests-shared -e 'examples/stepcore-dict-store[test]'
"$work/venv/bin/python" -m pytest -rs -p no:cacheprovider examples/stepcore-dict-store "$@"
