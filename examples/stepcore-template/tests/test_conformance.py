"""The whole conformance kit against `TemplateStepStore`, with the hooks a persistent store provides."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from stepcore_template import TemplateStepStore
from stepcore_template.store import key_name

from stepcore import StepStore
from stepcore_conformance import Damage, StepStoreConformance


async def damage_files(store: StepStore, kind: str, run_id: str, ident: int | str | None, replacement: bytes) -> None:
    """The kit's damage hook: put `replacement` in place of one stored body, as a broken disk would."""
    assert isinstance(store, TemplateStepStore)
    folder = store.directory / 'runs' / run_id
    if kind == 'run':
        paths = [folder / 'run.json']
    elif kind == 'event':
        paths = list((folder / 'events').glob(f'{ident}.*'))  # `<seq>.json` or `<seq>.<key name>.json`
    elif kind == 'effect':
        paths = [folder / 'effects' / f'{key_name(str(ident))}.json']
    elif kind == 'snapshot':
        paths = [folder / 'snapshots' / f'{ident}.json']
    else:
        assert kind == 'message', kind
        paths = [p for p in (folder / 'nodes').glob('*.json') if str(ident) in json.loads(p.read_bytes())['body']]
    assert paths, f'no stored {kind} {ident!r} of run {run_id!r}'
    for path in paths:
        assert path.exists(), f'no stored {kind} {ident!r} of run {run_id!r}'
        document = json.loads(path.read_bytes())
        path.write_text(json.dumps({**document, 'body': replacement.decode()}))


class TestTemplateStepStore(StepStoreConformance):
    @pytest.fixture
    async def store(self, tmp_path: Path, store_options: dict[str, Any]) -> AsyncIterator[TemplateStepStore]:
        store = TemplateStepStore(tmp_path / 'runs', **store_options)
        yield store
        await store.aclose()

    @pytest.fixture
    def store_spec(self, tmp_path: Path) -> dict[str, Any]:
        """How another store, or another process, opens the same data: `stepcore.from_spec(**store_spec)`."""
        return {'backend': 'template', 'directory': str(tmp_path / 'runs')}

    @pytest.fixture
    def damage(self) -> Damage:
        return damage_files
