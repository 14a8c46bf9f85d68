"""`stepcore.open_store(url, **options)`: each plugin's URLs, merged options, and stores that really open.

The MongoDB and PostgreSQL tests need the servers `scripts/test.sh` starts (`STEP_MONGO_URL`,
`STEP_POSTGRES_URL`); without them they fail, never skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from psycopg import sql
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel
from pymongo import MongoClient

import stepcore
from stepcore import RunRecord, StepPersistence, StepStore, continue_run
from stepcore.engine import EngineStore
from stepcore.engine.memory import InMemoryStepStore
from stepcore.plugins.registry import Registry, build_manager, get_registry


@pytest.mark.parametrize(
    ('url', 'backend', 'options'),
    [
        ('sqlite:///runs.db', 'sqlite', {'database': Path('runs.db')}),
        ('sqlite:////var/lib/runs.db', 'sqlite', {'database': Path('/var/lib/runs.db')}),
        ('sqlite://runs.db', 'sqlite', {'database': Path('runs.db')}),
        ('  sqlite:///runs.db  ', 'sqlite', {'database': Path('runs.db')}),
        ('SQLITE:///runs.db', 'sqlite', {'database': Path('runs.db')}),
        ('sqlite:///runs.db?timeout=5', 'sqlite', {'database': Path('runs.db'), 'timeout': '5'}),
        ('sqlite:///~/runs.db', 'sqlite', {'database': Path.home() / 'runs.db'}),
        ('file:///srv/runs', 'file', {'directory': Path('/srv/runs')}),
        ('file://localhost/srv/runs', 'file', {'directory': Path('/srv/runs')}),
        ('file:runs', 'file', {'directory': Path('runs')}),
        ('file://runs', 'file', {'directory': Path('runs')}),
        ('file:runs?durability=full', 'file', {'directory': Path('runs'), 'durability': 'full'}),
        (
            'mongodb://user:pw@localhost:27017/agents?authSource=admin',
            'mongo',
            {'db_url': 'mongodb://user:pw@localhost:27017/?authSource=admin', 'database': 'agents'},
        ),
        (
            'mongodb+srv://cluster0.example.net/agents',
            'mongo',
            {'db_url': 'mongodb+srv://cluster0.example.net/', 'database': 'agents'},
        ),
        ('postgresql://u@localhost/db', 'postgres', {'dsn': 'postgresql://u@localhost/db'}),
        ('postgres://u@h:5433/db?sslmode=require', 'postgres', {'dsn': 'postgres://u@h:5433/db?sslmode=require'}),
        (
            'postgresql://u@h/db?sslmode=require&table_prefix=agents',
            'postgres',
            {'dsn': 'postgresql://u@h/db?sslmode=require', 'table_prefix': 'agents'},
        ),
        ('memory://', 'memory', {}),
        ('memory://?max_snapshots_per_run=5', 'memory', {'max_snapshots_per_run': '5'}),
        ('mongo://?db_url=mongodb://h/&database=x', 'mongo', {'db_url': 'mongodb://h/', 'database': 'x'}),
    ],
)
def test_url_table(url: str, backend: str, options: dict[str, Any]) -> None:
    found, found_options = get_registry().for_url('step', url)
    assert (found.info.key, found_options) == (backend, options)


@pytest.mark.parametrize(
    ('url', 'message'),
    [
        ('runs.db', "store 'runs.db' is not a URL: use one like sqlite:///runs.db"),
        ('sqlite://', 'names no database file: use sqlite:///runs.db'),
        ('file://', 'names no folder: use file:///path/to/runs'),
        ('mongodb://localhost:27017', 'names no database: add it as the path'),
        ('mongodb://localhost/a/b', 'names no database'),
        ('etcd://localhost', "unknown store URL scheme 'etcd'"),
        ('memory://?a=1&a=2', "gives option 'a' twice"),
        # A backend named by its key reads only the query: a host or path would be dropped silently.
        ('memory:///tmp/runs', "backend 'memory' by its key, so only its query string is read and '/tmp/runs' would"),
        ('mongo://h/agents?database=x', "backend 'mongo' by its key, so only its query string is read and 'h/agents'"),
    ],
)
def test_refused_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stepcore.open_store(url)


def test_unknown_scheme_lists_what_is_installed() -> None:
    with pytest.raises(ValueError, match="unknown store URL scheme 'etcd'") as raised:
        stepcore.open_store('etcd://localhost:2379')
    text = str(raised.value)
    schemes = ('sqlite://', 'file://', 'mongodb://', 'mongodb+srv://', 'postgresql://', 'postgres://', 'redis://')
    for scheme in (*schemes, 'rediss://'):
        assert scheme in text
    assert 'KEY://?option=value' in text
    assert 'pip install' not in text


def test_scheme_of_a_backend_not_installed_names_its_package() -> None:
    registry = Registry(build_manager(load_entrypoints=False))
    with pytest.raises(ValueError, match='For mongodb\\+srv:// install: pip install step-mongo'):
        registry.for_url('step', 'mongodb+srv://cluster0.example.net/agents')
    with pytest.raises(ValueError, match='pip install step-postgres'):
        registry.for_url('step', 'postgresql://u@localhost/db')
    with pytest.raises(ValueError, match='For rediss:// install: pip install step-redis'):
        registry.for_url('step', 'rediss://cache.example.net:6380/0')


def test_keyword_options_merge_with_the_url() -> None:
    store = stepcore.open_store('memory://', max_snapshots_per_run=3)
    assert isinstance(store, InMemoryStepStore)
    assert store.max_snapshots_per_run == 3
    same = stepcore.open_store('memory://?max_snapshots_per_run=3', max_snapshots_per_run=3)
    assert isinstance(same, EngineStore)
    assert same.max_snapshots_per_run == 3
    with pytest.raises(ValueError, match="option 'max_snapshots_per_run' is given both in the URL and as a keyword"):
        stepcore.open_store('memory://?max_snapshots_per_run=2', max_snapshots_per_run=3)


def test_url_options_are_converted_to_the_types_the_store_takes() -> None:
    store = stepcore.open_store('memory://?max_snapshots_per_run=4')
    assert isinstance(store, InMemoryStepStore)
    assert store.max_snapshots_per_run == 4
    with pytest.raises(ValueError, match="option max_snapshots_per_run='many' must be an integer"):
        stepcore.open_store('memory://?max_snapshots_per_run=many')


def test_misspelled_url_option_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    database = tmp_path / 'runs.db'
    with pytest.raises(ValueError, match='max_snapshot_per_run') as raised:
        stepcore.open_store(f'sqlite:///{database}?max_snapshot_per_run=2')
    text = str(raised.value)
    assert "step store backend 'sqlite' has no option 'max_snapshot_per_run'" in text
    assert "did you mean 'max_snapshots_per_run'?" in text
    assert 'it takes: database, connection,' in text
    assert not database.exists()


async def _register(store: StepStore, run_id: str) -> None:
    try:
        await store.register_run(RunRecord(run_id=run_id, agent_name='opener'))
    finally:
        await store.aclose()


async def _run_ids(store: StepStore) -> list[str]:
    try:
        return [r.run_id for r in await store.list_runs()]
    finally:
        await store.aclose()


async def test_sqlite_relative_and_absolute_urls_open_one_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = stepcore.open_store('sqlite:///runs.db?max_snapshots_per_run=2&timeout=5')
    assert type(store).__name__ == 'SqliteStepStore'
    assert isinstance(store, EngineStore)
    assert store.max_snapshots_per_run == 2
    await _register(store, 'sqlite-run')
    assert (tmp_path / 'runs.db').is_file()
    assert await _run_ids(stepcore.open_store(f'sqlite:///{tmp_path / "runs.db"}')) == ['sqlite-run']
    assert await _run_ids(stepcore.from_spec('sqlite', database=str(tmp_path / 'runs.db'))) == ['sqlite-run']


async def test_file_urls_open_one_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = stepcore.open_store('file:runs', max_snapshots_per_run=2)
    assert type(store).__name__ == 'FileStepStore'
    await _register(store, 'file-run')
    assert (tmp_path / 'runs').is_dir()
    assert await _run_ids(stepcore.open_store(f'file://{tmp_path / "runs"}')) == ['file-run']
    assert await _run_ids(stepcore.open_store('file://runs?durability=full')) == ['file-run']


@pytest.mark.parametrize(
    ('url', 'media'),
    [
        ('sqlite:///runs.db?media_store=auto', 'SqliteMediaStore'),
        ('file:runs?media_store=auto', 'DiskMediaStore'),
        ('memory://?media_store=auto', None),
    ],
)
async def test_media_store_auto_in_a_url_is_the_default_media_store(
    url: str, media: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = stepcore.open_store(url)
    assert isinstance(store, EngineStore)
    assert (type(store.media_store).__name__ if store.media_store is not None else None) == media
    with pytest.raises(ValueError, match="media_store='disk' is not a media store"):
        stepcore.open_store(url.replace('=auto', '=disk'))
    await store.aclose()


def _server(variable: str, script: str) -> str:
    url = os.environ.get(variable, '').strip()
    if not url:
        pytest.fail(f'{variable} is not set: start a server with `export {variable}="$(scripts/{script} start)"`')
    return url


@pytest.fixture
def mongo_database() -> Iterator[tuple[str, str]]:
    """The server URL and a fresh database name, dropped afterwards."""
    url = _server('STEP_MONGO_URL', 'mongo-server.sh').rstrip('/')
    name = f'stepcore_open_{uuid.uuid4().hex[:12]}'
    yield url, name
    with MongoClient[dict[str, Any]](url, serverSelectionTimeoutMS=5000) as client:
        client.drop_database(name)


async def test_mongodb_url_opens_the_named_database(mongo_database: tuple[str, str]) -> None:
    url, name = mongo_database
    store = stepcore.open_store(f'{url}/{name}', max_snapshots_per_run=3, media_store='auto')
    assert type(store).__name__ == 'MongoStepStore'
    assert type(cast(EngineStore, store).media_store).__name__ == 'MongoMediaStore'
    await _register(store, 'mongo-run')
    with MongoClient[dict[str, Any]](url, serverSelectionTimeoutMS=5000) as client:
        assert name in client.list_database_names()
    assert await _run_ids(stepcore.from_spec('mongo', db_url=url, database=name)) == ['mongo-run']


@pytest.fixture
def postgres_prefix() -> Iterator[tuple[str, str]]:
    """The server URL and a fresh table prefix; its tables are dropped afterwards."""
    url = _server('STEP_POSTGRES_URL', 'postgres-server.sh')
    prefix = f'open_{uuid.uuid4().hex[:12]}'
    yield url, prefix
    with psycopg.connect(url, autocommit=True) as conn:
        names = conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE %s", (prefix + r'\_%',)
        ).fetchall()
        for (name,) in names:
            conn.execute(sql.SQL('DROP TABLE IF EXISTS {} CASCADE').format(sql.Identifier(name)))


async def test_postgresql_url_is_the_dsn(postgres_prefix: tuple[str, str]) -> None:
    url, prefix = postgres_prefix
    store = stepcore.open_store(url, table_prefix=prefix, media_store='auto')
    assert type(store).__name__ == 'PostgresStepStore'
    assert type(cast(EngineStore, store).media_store).__name__ == 'PostgresMediaStore'
    await _register(store, 'postgres-run')
    short = 'postgres://' + url.split('://', 1)[1]
    assert await _run_ids(stepcore.open_store(f'{short}', table_prefix=prefix)) == ['postgres-run']


def test_must_exist_checks_the_location_through_the_backend_s_plugin(tmp_path: Path) -> None:
    from stepcore.plugins.registry import StoreLocationError

    with pytest.raises(StoreLocationError, match=r'no sqlite store at .*missing\.db.* does not exist'):
        stepcore.open_store(f'sqlite:///{tmp_path}/missing.db', must_exist=True)
    assert not (tmp_path / 'missing.db').exists()
    (tmp_path / 'notes.txt').write_text('not a database')
    with pytest.raises(StoreLocationError, match='is not a SQLite database'):
        stepcore.open_store(f'sqlite:///{tmp_path}/notes.txt', must_exist=True)
    with pytest.raises(StoreLocationError, match='is a folder, not a SQLite database file'):
        stepcore.open_store(f'sqlite:///{tmp_path}', must_exist=True)
    with pytest.raises(StoreLocationError, match='is a file, not a folder of runs'):
        stepcore.open_store(f'file://{tmp_path}/notes.txt', must_exist=True)


def test_the_inspector_does_not_import_the_command_line() -> None:
    import ast

    ui = Path(stepcore.__file__).parent / 'ui'
    for module in sorted(ui.glob('*.py')):
        for node in ast.walk(ast.parse(module.read_text(encoding='utf-8'))):
            if isinstance(node, ast.ImportFrom):
                name = '.' * node.level + (node.module or '')
                assert 'cli' not in name.split('.'), f'{module.name} imports {name}'


async def test_from_spec_builds_a_persistent_backend(tmp_path: Path) -> None:
    database = tmp_path / 'runs.db'
    capability = StepPersistence.from_spec('sqlite', database=str(database), max_snapshots_per_run=2)
    agent = Agent(TestModel(), capabilities=[capability])
    try:
        result = await agent.run('hi')
        assert type(capability.store).__name__ == 'SqliteStepStore'
        assert database.exists()
        assert len(await continue_run(capability.store, run_id=result.run_id)) == 2
    finally:
        await capability.store.aclose()
