"""Store URLs on the command line: what each names, and what the CLI checks on top of `stepcore.open_store`."""

from __future__ import annotations

from pathlib import Path

import pytest

import stepcore
from stepcore.cli._loop import run_coroutine
from stepcore.cli.stores import StoreError, open_store, parse_store_url
from stepcore.engine.memory import InMemoryStepStore


def test_sqlite_urls() -> None:
    relative = parse_store_url('sqlite:///runs.db')
    assert (relative.backend, relative.options) == ('sqlite', {'database': Path('runs.db')})
    assert relative.local_path == Path('runs.db')
    absolute = parse_store_url('sqlite:////var/lib/runs.db')
    assert absolute.options == {'database': Path('/var/lib/runs.db')}
    assert absolute.describe() == 'sqlite store at /var/lib/runs.db'


def test_file_urls() -> None:
    assert parse_store_url('file:///srv/runs').options == {'directory': Path('/srv/runs')}
    assert parse_store_url('file:runs').options == {'directory': Path('runs')}
    assert parse_store_url('file://runs').options == {'directory': Path('runs')}


def test_mongo_urls() -> None:
    target = parse_store_url('mongodb://user:pw@localhost:27017/agents?authSource=admin')
    assert target.backend == 'mongo'
    assert target.options == {'db_url': 'mongodb://user:pw@localhost:27017/?authSource=admin', 'database': 'agents'}
    assert target.local_path is None
    with pytest.raises(StoreError, match='names no database'):
        parse_store_url('mongodb://localhost:27017')


def test_postgres_urls_go_to_the_postgres_backend() -> None:
    target = parse_store_url('postgresql://u@localhost/db')
    assert (target.backend, target.options) == ('postgres', {'dsn': 'postgresql://u@localhost/db'})
    assert parse_store_url('postgres://u@localhost/db').options == {'dsn': 'postgres://u@localhost/db'}


def test_installed_backend_key_as_scheme() -> None:
    target = parse_store_url('mongo://?db_url=mongodb://h/&database=agents')
    assert (target.backend, target.options) == ('mongo', {'db_url': 'mongodb://h/', 'database': 'agents'})


def test_memory_opens_as_a_library_call_but_not_on_the_command_line() -> None:
    assert isinstance(stepcore.open_store('memory://'), InMemoryStepStore)
    with pytest.raises(StoreError, match='memory:// cannot be inspected: an in-memory store lives and dies'):
        open_store('memory://')


@pytest.mark.parametrize(
    ('url', 'message'),
    [
        ('memory://', 'cannot be inspected'),
        ('etcd://localhost', "unknown store URL scheme 'etcd'"),
        ('runs.db', 'is not a URL'),
        ('sqlite://', 'names no database file'),
        ('file://', 'names no folder'),
        ('mongodb://localhost:27017', 'names no database'),
    ],
)
def test_refused_urls(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        parse_store_url(url)


async def test_open_store_does_not_create_what_it_reads(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match='does not exist'):
        open_store(f'sqlite:///{tmp_path / "nope.db"}')
    assert not (tmp_path / 'nope.db').exists()
    store = open_store(f'sqlite:///{tmp_path / "new.db"}', must_exist=False)
    try:
        assert await store.list_runs() == []
    finally:
        await store.aclose()


async def _create(url: str) -> None:
    store = stepcore.open_store(url)
    try:
        await store.list_runs()
    finally:
        await store.aclose()


def test_a_misspelled_store_option_on_the_command_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from stepcore.cli import app

    database = tmp_path / 'runs.db'
    run_coroutine(_create(f'sqlite:///{database}'))
    assert database.is_file()
    result = CliRunner().invoke(app, ['runs', '-s', f'sqlite:///{database}?max_snapshot_per_run=3'])
    assert result.exit_code == 1
    assert "no option 'max_snapshot_per_run' (did you mean 'max_snapshots_per_run'?)" in result.stderr
    ok = CliRunner().invoke(app, ['runs', '-s', f'sqlite:///{database}?max_snapshots_per_run=3'])
    assert ok.exit_code == 0, ok.stderr
    assert 'no runs in this store' in ok.stdout


def test_every_command_documents_itself() -> None:
    import typer.main
    from typer.testing import CliRunner

    from stepcore.cli import app

    group = typer.main.get_group(app)
    names = group.list_commands(None)  # pyright: ignore[reportArgumentType]
    assert names[0] == 'demo'
    for name in names:
        result = CliRunner().invoke(app, [name, '--help'], env={'COLUMNS': '200'})
        assert result.exit_code == 0, result.stderr
        assert 'Usage: ' in result.stdout
    assert '--store' in CliRunner().invoke(app, ['runs', '--help'], env={'COLUMNS': '200'}).stdout
