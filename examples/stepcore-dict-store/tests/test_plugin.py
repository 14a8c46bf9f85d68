"""The entry point is installed: stepcore finds the `dict` backend by its key."""

from stepcore_dict_store import DictStepStore

import stepcore
from stepcore.registry import get_registry


async def test_from_spec_builds_the_store() -> None:
    store = stepcore.from_spec('dict')
    assert isinstance(store, DictStepStore)
    await store.aclose()


def test_plugin_declares_what_the_class_declares() -> None:
    backend = get_registry().get('step', 'dict')
    assert backend.distribution == 'stepcore-dict-store'
    assert backend.features() == DictStepStore.features


def test_the_command_line_opens_it_by_url() -> None:
    from typer.testing import CliRunner

    from stepcore.cli import app

    result = CliRunner().invoke(app, ['runs', '--store', 'dict://', '--json'])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == '[]'
    listed = CliRunner().invoke(app, ['plugins', '--json'])
    assert 'stepcore-dict-store' in listed.stdout
