"""`stepcore gc` over real stores filled by real agent runs holding images."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from typer.testing import CliRunner

from media_disk import DiskMediaStore
from step_file import FileStepStore
from step_sqlite import SqliteStepStore
from stepcore import StepPersistence, StepStore
from stepcore.cli import app
from stepcore.cli._loop import run_coroutine
from stepcore.cli.collect import parse_duration
from stepcore.media import media_uri

runner = CliRunner()


def _image(n: int) -> bytes:
    return bytes([n]) * 100_000


def _describe(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del messages, info
    return ModelResponse(parts=[TextPart('a grey square')])


async def _runs_with_images(store: StepStore, count: int, delete: int) -> None:
    """`count` agent runs, each sent one image, then the first `delete` runs deleted."""
    agent = Agent(FunctionModel(_describe), capabilities=[StepPersistence(store=store)])
    binary = cast(Callable[..., BinaryContent], BinaryContent)
    try:
        for n in range(count):
            await agent.run(['what is this?', binary(data=_image(n), media_type='image/png')], run_id=f'vision-{n}')
        for n in range(delete):
            assert await store.delete_run(f'vision-{n}')
    finally:
        await store.aclose()


def cli(*args: str) -> Any:
    return runner.invoke(app, ['gc', *args], env={'COLUMNS': '200'})


def gc_json(*args: str) -> dict[str, Any]:
    result = cli(*args, '--json')
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    database = tmp_path / 'runs.db'
    run_coroutine(_runs_with_images(SqliteStepStore(database=database), count=3, delete=1))
    return f'sqlite:///{database}'


def test_a_deleted_runs_image_is_removed_and_the_others_stay(sqlite_url: str) -> None:
    report = gc_json('--store', sqlite_url, '--grace', '0')
    assert report['removed_uris'] == [media_uri(_image(0))]
    assert (report['runs'], report['kept_referenced'], report['bytes_freed']) == (2, 2, 100_000)
    again = gc_json('--store', sqlite_url, '--grace', '0')
    assert (again['removed'], again['kept']) == (0, 2)


def test_young_blobs_stay_within_the_default_grace(sqlite_url: str) -> None:
    report = gc_json('--store', sqlite_url)
    assert (report['removed'], report['kept_young'], report['kept_referenced']) == (0, 1, 2)


def test_dry_run_prints_what_would_go_and_removes_nothing(sqlite_url: str) -> None:
    result = cli('--store', sqlite_url, '--grace', '0', '--dry-run')
    assert result.exit_code == 0, result.stderr
    assert 'dry run: nothing removed' in result.stdout
    assert 'would remove' in result.stdout
    assert '97.7 KiB' in result.stdout
    assert gc_json('--store', sqlite_url, '--grace', '0')['removed'] == 1


def test_a_media_store_given_by_url(tmp_path: Path) -> None:
    runs, blobs = tmp_path / 'runs', tmp_path / 'blobs'
    run_coroutine(_runs_with_images(FileStepStore(runs, media_store=DiskMediaStore(blobs)), count=2, delete=1))
    media = f'disk://?directory={blobs}'
    report = gc_json('--store', f'file://{runs}', '--media', media, '--grace', '0')
    assert report['removed_uris'] == [media_uri(_image(0))]
    assert not (blobs / f'{media_uri(_image(0)).removeprefix("media+sha256://")}.bin').exists()
    assert (blobs / f'{media_uri(_image(1)).removeprefix("media+sha256://")}.bin').exists()


def test_bad_input_is_named(sqlite_url: str, tmp_path: Path) -> None:
    result = cli('--store', sqlite_url, '--grace', 'soon')
    assert result.exit_code == 1
    assert "--grace 'soon' is not a duration" in result.stderr
    result = cli('--store', sqlite_url, '--media', 'nosuch://?x=1')
    assert result.exit_code == 1
    assert "--media 'nosuch://?x=1'" in result.stderr
    result = cli('--store', f'sqlite:///{tmp_path / "nothing.db"}')
    assert result.exit_code == 1
    assert 'does not exist' in result.stderr


def test_a_bad_media_url_closes_the_step_store_it_opened(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import stepcore.cli.collect as collect

    real_open = collect.open_store
    closed: list[str] = []

    def open_watched(url: str) -> StepStore:
        store = real_open(url)
        real_close = store.aclose

        async def aclose() -> None:
            closed.append(url)
            await real_close()

        monkeypatch.setattr(store, 'aclose', aclose)
        return store

    monkeypatch.setattr(collect, 'open_store', open_watched)
    result = cli('--store', sqlite_url, '--media', 'nosuch://?x=1')
    assert result.exit_code == 1
    assert closed == [sqlite_url]


def test_no_store_is_one_error_line_not_a_traceback() -> None:
    result = runner.invoke(app, ['gc', '--dry-run'], env={'COLUMNS': '200', 'STEPCORE_STORE': None})
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.stderr.strip().splitlines() == [
        'error: no store given: pass --store URL or set STEPCORE_STORE (e.g. STEPCORE_STORE=sqlite:///runs.db)'
    ]
    assert 'Traceback' not in result.output


@pytest.mark.parametrize(
    ('text', 'expected'),
    [('0', timedelta(0)), ('30s', timedelta(seconds=30)), ('1h30m', timedelta(minutes=90)), ('2D', timedelta(days=2))],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize('text', ['', '1', 'h', '1x', '-1h', '1h and more'])
def test_durations_refused(text: str) -> None:
    with pytest.raises(ValueError, match='is not a duration'):
        parse_duration(text)
