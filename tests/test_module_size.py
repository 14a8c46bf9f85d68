"""No module of a package grows past `LIMIT` lines unnoticed: a module that long usually does several jobs.

Every module under `packages/*/src` is counted. Those already over the limit are listed in
`OVER_LIMIT` until they are split; the list only shrinks, so a listed module that got under the
limit has to leave it (and may not grow back).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LIMIT = 600
"""Most lines a module may have."""

# This list is to shrink: split a listed module along its jobs, then take it off. Never add one.
OVER_LIMIT = {
    'packages/media-s3/src/media_s3/store.py',
    'packages/step-file/src/step_file/store.py',
    'packages/step-mongo/src/step_mongo/store.py',
    'packages/step-postgres/src/step_postgres/store.py',
    'packages/stepcore/src/stepcore/common/telemetry.py',
}
"""Modules over `LIMIT` not split yet, by their path from the repository's root."""


def _sizes() -> dict[str, int]:
    """Every module of every package's `src`, by its path from the root, with its number of lines."""
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding='utf-8').splitlines())
        for path in ROOT.glob('packages/*/src/**/*.py')
    }
    assert 'packages/stepcore/src/stepcore/__init__.py' in sizes, f'no package modules found under {ROOT}/packages'
    return sizes


def test_no_module_off_the_list_is_over_the_limit() -> None:
    over = {path: lines for path, lines in sorted(_sizes().items()) if lines > LIMIT and path not in OVER_LIMIT}
    assert not over, (
        f'modules over {LIMIT} lines: '
        + ', '.join(f'{path} ({lines})' for path, lines in over.items())
        + '. Split each into modules with one job each (move code, and change its importers)'
    )


def test_every_listed_module_is_still_over_the_limit() -> None:
    sizes = _sizes()
    done = {path: sizes.get(path) for path in sorted(OVER_LIMIT) if sizes.get(path, 0) <= LIMIT}
    assert not done, (
        'modules in OVER_LIMIT that are no longer over '
        f'{LIMIT} lines: '
        + ', '.join(f'{path} ({"gone" if lines is None else lines})' for path, lines in done.items())
        + '. Take them off the list in tests/test_module_size.py, so they stay under the limit'
    )
