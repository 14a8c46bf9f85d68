#!/usr/bin/env bash
# Print the path of a uv binary, installing uv from PyPI with pip when none is on PATH.
set -euo pipefail
if command -v uv >/dev/null 2>&1; then
    command -v uv
    exit 0
fi
python3 -m pip install --quiet --disable-pip-version-check 'uv==0.13.9' >&2
if command -v uv >/dev/null 2>&1; then
    command -v uv
else
    python3 -c 'import os, sysconfig; print(os.path.join(sysconfig.get_path("scripts"), "uv"))'
fi
