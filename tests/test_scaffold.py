"""`stepcore new-backend NAME` writes a backend package that installs, registers and passes its own tests.

The example under `examples/stepcore-template` is the command's output for the name `template`,
byte for byte: the template shipped in the stepcore package is the one source of both.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from stepcore.cli import app
from stepcore.cli.scaffold import BackendNames, new_backend, render_backend
from stepcore.plugins import registry

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / 'examples' / 'stepcore-template'
NOT_THE_PACKAGE = {'__pycache__', '.pytest_cache', '.ruff_cache', '.venv', 'build', 'dist'}
"""What running or building the example leaves in its folder (all of it ignored by git)."""


def _package_files(folder: Path) -> dict[PurePosixPath, bytes]:
    return {
        PurePosixPath(path.relative_to(folder).as_posix()): path.read_bytes()
        for path in sorted(folder.rglob('*'))
        if path.is_file()
        and not NOT_THE_PACKAGE.intersection(path.relative_to(folder).parts)
        and not any(part.endswith('.egg-info') for part in path.parts)
    }


def test_the_example_is_what_the_command_writes_for_template() -> None:
    rendered = render_backend(BackendNames.of('template'))
    example = _package_files(EXAMPLE)
    fix = (
        'edit the template in packages/stepcore/src/stepcore/cli/backend_template/, then run '
        '`stepcore new-backend template --into examples/stepcore-template --force`'
    )
    assert sorted(rendered) == sorted(example), fix
    differing = [str(path) for path, data in rendered.items() if example[path] != data]
    assert not differing, f'examples/stepcore-template differs in {differing}: {fix}'


@pytest.mark.parametrize(
    ('name', 'key', 'distribution', 'package', 'store_class'),
    [
        ('acme', 'acme', 'stepcore-acme', 'stepcore_acme', 'AcmeStepStore'),
        ('my-store', 'my-store', 'stepcore-my-store', 'stepcore_my_store', 'MyStoreStepStore'),
        ('my_store', 'my-store', 'stepcore-my-store', 'stepcore_my_store', 'MyStoreStepStore'),
        ('s3x2', 's3x2', 'stepcore-s3x2', 'stepcore_s3x2', 'S3x2StepStore'),
    ],
)
def test_every_name_follows_from_the_backend_name(
    name: str, key: str, distribution: str, package: str, store_class: str
) -> None:
    names = BackendNames.of(name)
    assert (names.name, names.distribution, names.package, names.store_class) == (
        key,
        distribution,
        package,
        store_class,
    )


@pytest.mark.parametrize(
    ('name', 'instead'),
    [
        ('Acme', 'acme'),
        ('acme store', 'acme-store'),
        ('acme.db', 'acme-db'),
        ('2fast', 'fast'),
        ('acme-', 'acme'),
        ('a--b', 'a-b'),
        ('', 'acme'),
        ('stepcore-acme', 'acme'),
        ('stepcore_acme_db', 'acme-db'),
        ('sqlite', 'my-sqlite'),  # our own backends' keys and URL schemes are taken
        ('memory', 'my-memory'),
        ('s3', 'my-s3'),
        ('postgresql', 'my-postgresql'),
        ('rediss', 'my-rediss'),
    ],
)
def test_an_unusable_name_is_refused_with_one_to_use_instead(name: str, instead: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f'backend name {name!r}')) as refused:
        BackendNames.of(name)
    assert repr(instead) in str(refused.value)


def test_a_folder_that_is_not_empty_is_written_only_with_force(tmp_path: Path) -> None:
    (tmp_path / 'notes.txt').write_text('mine')
    with pytest.raises(FileExistsError, match='is not empty'):
        new_backend('acme', tmp_path)
    written = new_backend('acme', tmp_path, force=True)
    assert tmp_path / 'src' / 'stepcore_acme' / 'store.py' in written
    assert (tmp_path / 'notes.txt').read_text() == 'mine'
    with pytest.raises(FileExistsError, match='is a file'):
        new_backend('acme', tmp_path / 'notes.txt', force=True)


def test_the_command_says_where_it_wrote_and_what_to_run_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ['new-backend', 'acme'])
    assert result.exit_code == 0, result.output
    where = tmp_path / 'stepcore-acme'
    assert (where / 'pyproject.toml').is_file()
    assert f'wrote stepcore-acme into {where}' in result.stdout
    assert '  src/stepcore_acme/store.py\n' in result.stdout
    assert "backend 'acme' (URL scheme acme://), package stepcore_acme, class AcmeStepStore" in result.stdout
    assert f'cd {where}' in result.stdout
    assert f'STEPCORE={ROOT} ' in result.stdout  # the checkout stepcore runs from
    assert 'pytest -rs' in result.stdout

    again = CliRunner().invoke(app, ['new-backend', 'acme'])
    assert again.exit_code == 1
    assert 'is not empty: give a new folder, or --force' in again.stderr
    forced = CliRunner().invoke(app, ['new-backend', 'acme', '--force'])
    assert forced.exit_code == 0, forced.output

    elsewhere = CliRunner().invoke(app, ['new-backend', 'acme', '--into', 'backends/acme'])
    assert elsewhere.exit_code == 0, elsewhere.output
    assert (tmp_path / 'backends' / 'acme' / 'src' / 'stepcore_acme' / 'plugin.py').is_file()


def test_the_command_refuses_an_unusable_name_and_writes_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ['new-backend', 'Acme', '--into', str(tmp_path / 'acme')])
    assert result.exit_code == 1
    assert "error: backend name 'Acme' cannot be used" in result.stderr
    assert "(e.g. 'acme')" in result.stderr
    assert not (tmp_path / 'acme').exists()


def _run(command: list[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, check=False, **kwargs)


@pytest.mark.slow
def test_a_new_backend_installs_registers_and_passes_its_own_tests(tmp_path: Path) -> None:
    """In one fresh environment (uv's cache fills it in seconds): stepcore, media-disk, the kit and the package."""
    package = tmp_path / 'stepcore-acme'
    written = new_backend('acme', package)

    leftovers = [
        f'{path.relative_to(package)}:{number}'
        for path in written
        for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1)
        if 'template' in line.lower()
    ]
    assert not leftovers, f'the template shows through in {leftovers}'
    assert not [path for path in written if 'template' in str(path.relative_to(package)).lower()]

    uv = _run(['bash', ROOT / 'scripts' / 'ensure-uv.sh']).stdout.strip()
    pins = tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['uv']['constraint-dependencies']
    constraints = tmp_path / 'constraints.txt'
    constraints.write_text('\n'.join(pins) + '\n')
    venv = tmp_path / 'venv'
    env = {key: value for key, value in os.environ.items() if not key.startswith(('PYTEST_', 'VIRTUAL_ENV'))}
    env['VIRTUAL_ENV'] = str(venv)
    made = _run([uv, 'venv', '--quiet', '--python', sys.executable, venv], env=env)
    assert made.returncode == 0, made.stderr
    editable = [
        ROOT / 'packages' / 'stepcore',
        ROOT / 'packages' / 'media-disk',
        ROOT / 'tests-shared',
        f'{package}[test]',
    ]
    install = [uv, 'pip', 'install', '--quiet', '-c', constraints, *(arg for path in editable for arg in ('-e', path))]
    installed = _run(install, env=env, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr

    listed = _run([venv / 'bin' / 'stepcore', 'plugins', '--json'], env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    plugins = {(row['distribution'], backend['kind'], backend['key']) for row in rows for backend in row['backends']}
    assert ('stepcore-acme', 'step', 'acme') in plugins, plugins

    tested = _run([venv / 'bin' / 'pytest', '-p', 'no:cacheprovider', '-q'], env=env, cwd=package, timeout=900)
    assert tested.returncode == 0, tested.stdout[-5000:] + tested.stderr[-5000:]
    passed = re.search(r'(\d+) passed', tested.stdout)
    assert passed, tested.stdout[-2000:]
    assert int(passed[1]) > 0
    assert 'TestAcmeStepStore (AcmeStepStore)' in tested.stdout  # the kit's closing report


def test_a_name_an_installed_plugin_answers_to_is_refused_unless_it_is_this_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def plugin(distribution: str, kind: str, key: str, *schemes: str) -> SimpleNamespace:
        backend = SimpleNamespace(kind=kind, info=SimpleNamespace(key=key, schemes=schemes))
        return SimpleNamespace(distribution=distribution, backends=(backend,))

    installed = SimpleNamespace(
        plugins=[plugin('acme-stores', 'step', 'widget', 'widgets'), plugin('stepcore-acme', 'step', 'acme', 'acme')]
    )
    monkeypatch.setattr(registry, 'get_registry', lambda: installed)
    for name in ('widget', 'widgets'):
        with pytest.raises(ValueError, match=re.escape(f'backend name {name!r} is taken: the installed acme-stores')):
            BackendNames.of(name)
    assert BackendNames.of('acme').distribution == 'stepcore-acme'  # written again over itself: fine
