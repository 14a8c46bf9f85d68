"""`stepcore new-backend NAME`: write a new backend package that works as written.

The package is the template under `backend_template/` with the backend's names filled in: a step
store on the storage engine keeping one JSON file per record, its plugin hook and entry point, and
tests running the whole conformance kit. Its author then replaces the port's file I/O with their
backend's. The repository's `examples/stepcore-template` is this command's output for the name
`template`, and a test keeps the two the same.

The template's files end in `.tmpl` (so nothing takes them for modules of stepcore), and hold
`{{placeholder}}`s, in their text and in their paths, for the names of `BackendNames`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from typing import Annotated

import typer

from stepcore.cli.console import fail
from stepcore.plugins import registry

__all__ = ('BackendNames', 'new_backend', 'new_backend_command', 'render_backend')

TEMPLATE = 'backend_template'
"""The template's folder, beside this module (package data of the stepcore distribution)."""
SUFFIX = '.tmpl'
CHECKOUT_PLACEHOLDER = '/path/to/stepcore'
"""How the generated README names the stepcore checkout the packages are installed from."""

_NAME = re.compile(r'[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*')
_PLACEHOLDER = re.compile(r'\{\{(\w+)\}\}')


@dataclass(frozen=True)
class BackendNames:
    """Every name of a backend package, derived from the backend's name (`acme`, `my-store`)."""

    name: str
    """The plugin key and URL scheme: `acme` (`_` becomes `-`, since a URL scheme cannot hold `_`)."""
    distribution: str
    """`stepcore-acme`."""
    package: str
    """The import package: `stepcore_acme`."""
    identifier: str
    """The name as a Python identifier, starting function names: `acme` (`acme_url_options`)."""
    Name: str
    """The name in CamelCase, starting class names: `Acme` (`AcmeStepStore`, `AcmePort`)."""

    @classmethod
    def of(cls, name: str) -> BackendNames:
        """The names for backend `name`; `ValueError`, saying what to use instead, for an unusable one."""
        if not _NAME.fullmatch(name):
            suggestion = re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-').lstrip('0123456789-') or 'acme'
            raise ValueError(
                f'backend name {name!r} cannot be used: give lowercase letters and digits, starting with a letter, '
                f'words joined by "-" or "_" (e.g. {suggestion!r})'
            )
        words = re.split(r'[-_]', name)
        if words[0] == 'stepcore':
            rest = '-'.join(words[1:]) or 'acme'
            raise ValueError(
                f'backend name {name!r} starts with "stepcore": give the backend\'s own name ({rest!r}); '
                f'its distribution is then named stepcore-{rest}'
            )
        user = _user_of('-'.join(words))
        if user is not None:
            raise ValueError(
                f'backend name {name!r} is taken: {user} uses it, and two backends of one name cannot be '
                f'installed together; give yours a name of its own (e.g. {"my-" + "-".join(words)!r})'
            )
        return cls(
            name='-'.join(words),
            distribution='stepcore-' + '-'.join(words),
            package='stepcore_' + '_'.join(words),
            identifier='_'.join(words),
            Name=''.join(word.capitalize() for word in words),
        )

    @property
    def store_class(self) -> str:
        return f'{self.Name}StepStore'


def _user_of(key: str) -> str | None:
    """What already uses `key` as a backend key or URL scheme: one of stepcore's own packages, or
    a plugin installed here other than the package of that name this command writes."""
    for (kind, own), distribution in registry.KNOWN_PACKAGES.items():
        if own == key:
            return f'{distribution} (its {kind} backend)'
    if key in registry.KNOWN_SCHEMES:
        return f'{registry.KNOWN_PACKAGES[("step", registry.KNOWN_SCHEMES[key])]} (its URL scheme {key}://)'
    for plugin in registry.get_registry().plugins:
        if plugin.distribution == f'stepcore-{key}':
            continue  # the package this command writes, installed: writing it again is fine
        for backend in plugin.backends:
            if key == backend.info.key or key in backend.info.schemes:
                return f'the installed {plugin.distribution} (its {backend.kind} backend {backend.info.key!r})'
    return None


def _fill(text: str, names: BackendNames) -> str:
    values = asdict(names)

    def value(match: re.Match[str]) -> str:
        if match[1] not in values:
            raise KeyError(f'the backend template has an unknown placeholder {match[0]}')
        return values[match[1]]

    return _PLACEHOLDER.sub(value, text)


def _template_files(folder: Traversable, path: PurePosixPath) -> list[tuple[PurePosixPath, Traversable]]:
    found: list[tuple[PurePosixPath, Traversable]] = []
    for entry in folder.iterdir():
        if entry.is_dir():
            found += _template_files(entry, path / entry.name)
        elif entry.name.endswith(SUFFIX):
            found.append((path / entry.name.removesuffix(SUFFIX), entry))
    return found


def render_backend(names: BackendNames) -> dict[PurePosixPath, bytes]:
    """The files of the backend package, by their path inside it."""
    template = files('stepcore.cli') / TEMPLATE
    return {
        PurePosixPath(_fill(str(path), names)): _fill(entry.read_bytes().decode('utf-8'), names).encode('utf-8')
        for path, entry in sorted(_template_files(template, PurePosixPath()), key=lambda pair: pair[0])
    }


def new_backend(name: str, destination: Path, *, force: bool = False) -> list[Path]:
    """Write the package of backend `name` into the folder `destination`; the files written.

    `destination` is created when missing. An existing folder must be empty unless `force`, which
    writes over files of the same names and leaves the others.
    """
    rendered = render_backend(BackendNames.of(name))
    if destination.exists() and not destination.is_dir():
        raise FileExistsError(f'{str(destination)!r} is a file: give a folder to write the package into')
    if destination.is_dir() and any(destination.iterdir()) and not force:
        raise FileExistsError(
            f'{str(destination)!r} is not empty: give a new folder, or --force to write the package over it'
        )
    written: list[Path] = []
    for path, data in rendered.items():
        target = destination.joinpath(*path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written.append(target)
    return written


def _checkout() -> Path | None:
    """The stepcore checkout this module runs from (an editable install), if it does."""
    here = Path(__file__).resolve().parents  # <checkout>/packages/stepcore/src/stepcore/cli/scaffold.py
    root = here[5] if len(here) > 5 else None
    return root if root is not None and (root / 'tests-shared' / 'pyproject.toml').is_file() else None


def _next_commands(readme: str) -> list[str]:
    """The commands of the package's README that install it and run its tests."""
    block = re.search(r'^```bash\n(.*?)^```', readme, re.MULTILINE | re.DOTALL)
    lines = block[1].splitlines() if block else []
    checkout = _checkout()
    if checkout is not None:
        lines = [line.replace(CHECKOUT_PLACEHOLDER, str(checkout)) for line in lines]
    return lines


def new_backend_command(
    name: Annotated[
        str,
        typer.Argument(
            metavar='NAME',
            help="The backend's name, its plugin key and URL scheme (e.g. acme): lowercase letters and digits, "
            'words joined by "-" or "_".',
            show_default=False,
        ),
    ],
    into: Annotated[
        Path | None,
        typer.Option(
            '--into', metavar='DIR', help='The folder to write the package into.', show_default='./stepcore-NAME'
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option('--force', help='Write into a folder that is not empty, over files of the same names.')
    ] = False,
) -> None:
    """Write a new backend package: a step store on the storage engine, its plugin, and its conformance tests."""
    try:
        names = BackendNames.of(name)
        destination = (into or Path(names.distribution)).absolute()
        written = new_backend(name, destination, force=force)
    except (ValueError, OSError) as error:
        fail(str(error))
    typer.echo(f'wrote {names.distribution} into {destination}:')
    for path in written:
        typer.echo(f'  {path.relative_to(destination).as_posix()}')
    typer.echo(
        f'backend {names.name!r} (URL scheme {names.name}://), package {names.package}, class {names.store_class}'
    )
    typer.echo('next, install it with stepcore and the conformance kit, and run its tests:')
    typer.echo(f'  cd {destination}')
    for line in _next_commands((destination / 'README.md').read_text(encoding='utf-8')):
        typer.echo(f'  {line}')
