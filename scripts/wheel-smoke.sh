#!/usr/bin/env bash
# Build every workspace package the way it is published and check each wheel on its own.
#
#   scripts/wheel-smoke.sh
#
# 1. `uv build --all-packages`: an sdist per package, then its wheel built from that sdist (so an
#    sdist missing a file fails here).
# 2. Every wheel and sdist carries the root LICENSE, byte for byte.
# 3. Each wheel is installed alone into a fresh virtual environment: its third-party dependencies
#    come from the package index within the workspace pins, and a sibling it depends on comes
#    from the wheel just built, never from the index. Then its module is imported, `stepcore`
#    answers `--version` (or `--help` where it has no such option), and every backend the wheel
#    registers is listed by `stepcore plugins` as available (its class and driver import). The
#    `stepcore` script itself also runs once, in the venv of the stepcore wheel.
# 4. The README's install commands: stepcore and step-sqlite by path from the checkout, and
#    `stepcore[all]` by name from the built wheels (`--find-links`).
#
# Runs in well under two minutes once uv's cache is warm; needs python3 and uv (installed from
# PyPI when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
UV=$(bash scripts/ensure-uv.sh)
work=$(mktemp -d -t stepcore-wheels.XXXXXX)
trap 'rm -rf "$work"' EXIT
dist="$work/dist"

say() { echo "wheel-smoke: $*" >&2; }

say "building every package into $dist"
"$UV" build --all-packages --quiet --out-dir "$dist"

# Checks the license files and writes the inputs of the installs: the workspace pins as
# constraints, one override per built wheel (`name @ file://...`) so that a sibling dependency
# resolves to the local build, and `name module wheel` lines to smoke-test.
python3 - "$dist" "$work" <<'PY'
import pathlib, sys, tarfile, tomllib, zipfile

dist, work = map(pathlib.Path, sys.argv[1:])
root = tomllib.loads(pathlib.Path('pyproject.toml').read_text())
members = sorted(
    p.parent
    for pattern in root['tool']['uv']['workspace']['members']
    for p in pathlib.Path('.').glob(pattern + '/pyproject.toml')
)
license_text = pathlib.Path('LICENSE').read_bytes()
problems, targets, overrides = [], [], []
for member in members:
    project = tomllib.loads((member / 'pyproject.toml').read_text())['project']
    name, version = project['name'], project['version']
    stem = name.replace('-', '_')
    wheel = dist / f'{stem}-{version}-py3-none-any.whl'
    sdist = dist / f'{stem}-{version}.tar.gz'
    if not wheel.exists() or not sdist.exists():
        problems.append(f'{name}: no {wheel.name} or {sdist.name} in {dist}')
        continue
    with zipfile.ZipFile(wheel) as zf:
        path = f'{stem}-{version}.dist-info/licenses/LICENSE'
        if path not in zf.namelist() or zf.read(path) != license_text:
            problems.append(f'{wheel.name}: {path} is missing or differs from the root LICENSE')
    with tarfile.open(sdist) as tf:
        member_file = tf.extractfile(f'{stem}-{version}/LICENSE')
        if member_file is None or member_file.read() != license_text:
            problems.append(f'{sdist.name}: LICENSE is missing or differs from the root LICENSE')
    targets.append(f'{name} {stem} {wheel}')
    overrides.append(f'{name} @ {wheel.as_uri()}')
if problems:
    sys.exit('wheel-smoke: ' + '\nwheel-smoke: '.join(problems))
(work / 'constraints.txt').write_text('\n'.join(root['tool']['uv']['constraint-dependencies']) + '\n')
(work / 'overrides.txt').write_text('\n'.join(overrides) + '\n')
(work / 'targets.txt').write_text('\n'.join(targets) + '\n')
print(f'wheel-smoke: {len(targets)} wheels and sdists carry the root LICENSE', file=sys.stderr)
PY

# Runs in a wheel's venv: imports the module, calls the `stepcore` console-script entry point with
# `--version` (`--help` where it has no such option) and `plugins --json`, all in one interpreter
# (importing stepcore costs seconds of CPU), and checks that every backend the distribution
# registers is available and that every workspace distribution in the venv is a local build.
check_venv() {  # distribution module python
    # shellcheck disable=SC2046  # one argument per workspace distribution name
    "$3" - "$1" "$2" "$(python3 -c 'import pathlib, sys; print(pathlib.Path(sys.argv[1]).as_uri())' "$dist")" \
        $(cut -d' ' -f1 "$work/targets.txt") <<'PY'
import contextlib, importlib, io, json, sys
from importlib.metadata import distributions, entry_points

name, module, dist_uri, *siblings = sys.argv[1:]
for installed in distributions():
    if installed.metadata['Name'] in siblings:
        origin = json.loads(installed.read_text('direct_url.json') or '{}').get('url', 'the index')
        if not origin.startswith(dist_uri + '/'):
            sys.exit(f"wheel-smoke: {name}: {installed.metadata['Name']} came from {origin}, not from {dist_uri}")
importlib.import_module(module)
(script,) = entry_points(group='console_scripts', name='stepcore')
main = script.load()


def run(*args: str) -> tuple[object, str, str]:
    sys.argv = ['stepcore', *args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
            code: object = 0
        except SystemExit as exit:
            code = exit.code or 0
    return code, out.getvalue(), err.getvalue()


flag = '--version'
code, _, err = run(flag)
if code != 0 and 'No such option' in err:
    flag = '--help'
    code, _, err = run(flag)
if code != 0:
    sys.exit(f'wheel-smoke: {name}: `stepcore {flag}` exited {code}: {err}')
code, out, err = run('plugins', '--json')
if code != 0:
    sys.exit(f'wheel-smoke: {name}: `stepcore plugins --json` exited {code}: {err}')
mine = [backend for plugin in json.loads(out) if plugin['distribution'] == name for backend in plugin['backends']]
broken = [f"{b['kind']} {b['key']}: {b['unavailable']}" for b in mine if 'unavailable' in b]
if broken:
    sys.exit(f'wheel-smoke: {name}: backends unavailable: ' + '; '.join(broken))
listed = ', '.join(b['kind'] + ' ' + b['key'] for b in mine) or 'none'
print(f'wheel-smoke: {name}: imports {module}; `stepcore {flag}` works; backends: {listed}', file=sys.stderr)
PY
}

count=0
while read -r name module wheel; do
    venv="$work/venv-$name"
    "$UV" venv --quiet --python 3.11 "$venv"
    "$UV" pip install --quiet --python "$venv/bin/python" \
        -c "$work/constraints.txt" --override "$work/overrides.txt" "$wheel"
    check_venv "$name" "$module" "$venv/bin/python"
    if [[ "$name" == stepcore ]]; then
        # The console script itself, once, in the venv of the distribution that declares it.
        if ! "$venv/bin/stepcore" --version >/dev/null 2>&1; then
            "$venv/bin/stepcore" --help >/dev/null
        fi
    fi
    count=$((count + 1))
done <"$work/targets.txt"
say "$count wheels installed alone, imported, and their backends available"

# The README's two ways to install today: by path from the checkout, and by name from the built
# wheels with --find-links (the extras of stepcore name sibling distributions).
require_backends() {  # venv how key...
    "$1/bin/stepcore" plugins --json | python3 -c '
import json, sys
how, wanted = sys.argv[1], set(sys.argv[2:])
keys = {b["key"] for p in json.load(sys.stdin) for b in p["backends"] if "unavailable" not in b}
sys.exit(None if wanted <= keys else f"wheel-smoke: installed {how}, {sorted(wanted - keys)} not available")' "${@:2}"
}
venv="$work/venv-by-path"
"$UV" venv --quiet --python 3.11 "$venv"
"$UV" pip install --quiet --python "$venv/bin/python" -c "$work/constraints.txt" ./packages/stepcore ./packages/step-sqlite
require_backends "$venv" 'by path' sqlite
venv="$work/venv-find-links"
"$UV" venv --quiet --python 3.11 "$venv"
"$UV" pip install --quiet --python "$venv/bin/python" -c "$work/constraints.txt" --find-links "$dist" 'stepcore[all]'
require_backends "$venv" 'as stepcore[all] from the wheels' sqlite file mongo postgres redis disk s3
say "installed by path (stepcore, step-sqlite) and by name from the wheels (stepcore[all]), as the README says"
