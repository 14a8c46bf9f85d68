"""Store URLs: which backend and options each names."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepcore.cli.stores import StoreError, open_store, parse_store_url


def test_sqlite_urls() -> None:
    relative = parse_store_url('sqlite:///runs.db')
    assert (relative.backend, relative.options) == ('sqlite', {'database': Path('runs.db')})
    absolute = parse_store_url('sqlite:////var/lib/runs.db')
    assert absolute.options == {'database': Path('/var/lib/runs.db')}


def test_file_urls() -> None:
    assert parse_store_url('file:///srv/runs').options == {'directory': Path('/srv/runs')}
    assert parse_store_url('file:runs').options == {'directory': Path('runs')}
    assert parse_store_url('file://runs').options == {'directory': Path('runs')}


def test_mongo_urls() -> None:
    target = parse_store_url('mongodb://user:pw@localhost:27017/agents?authSource=admin')
    assert target.backend == 'mongo'
    assert target.options == {'db_url': 'mongodb://user:pw@localhost:27017/?authSource=admin', 'database': 'agents'}
    with pytest.raises(StoreError, match='names no database'):
        parse_store_url('mongodb://localhost:27017')


def test_postgres_urls_go_to_the_postgres_backend() -> None:
    assert parse_store_url('postgresql://u@localhost/db').backend == 'postgres'
    assert parse_store_url('postgres://u@localhost/db').backend == 'postgres'


def test_installed_backend_key_as_scheme() -> None:
    target = parse_store_url('sqlite:///x.db')
    assert target.backend == 'sqlite'
    other = parse_store_url('file:///tmp/x')
    assert other.backend == 'file'


@pytest.mark.parametrize(
    ('url', 'message'),
    [
        ('memory://', 'cannot be inspected'),
        ('redis://localhost', "unknown store URL scheme 'redis'"),
        ('runs.db', 'is not a URL'),
        ('sqlite://', 'names no database file'),
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
