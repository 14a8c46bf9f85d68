"""The inspector on every persistent store, reading through the public store API only.

A real agent run whose tool returns a chart is written to the store with a low media threshold,
so the image goes through the store's media store; then `stepcore ui` is pointed at the store's
URL and the run, its snapshot and the image are read back over HTTP. PostgreSQL and MongoDB are
the servers `scripts/test.sh` starts (`STEP_POSTGRES_URL`, `STEP_MONGO_URL`).
"""

from __future__ import annotations

import html
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from media_disk import DiskMediaStore
from step_file import FileStepStore
from step_mongo import MongoStepStore
from step_postgres import PostgresStepStore
from stepcore import StepPersistence, StepStore
from stepcore.cli._loop import run_coroutine
from stepcore.cli.demo_chart import chart_png

_binary: Any = BinaryContent  # a pydantic dataclass: its constructor is not visible to type checkers


def _server(variable: str, script: str) -> str:
    url = os.environ.get(variable, '').strip()
    if not url:
        pytest.fail(f'{variable} is not set: start a server with `export {variable}="$(scripts/{script} start)"`')
    return url


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    if not any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
        return ModelResponse(parts=[ToolCallPart('plot', {'metric': 'export minutes'}, tool_call_id='call-plot')])
    return ModelResponse(parts=[TextPart('plotted')])


async def _run_agent(store: StepStore, run_id: str) -> None:
    agent = Agent(FunctionModel(_model), name='plotter', capabilities=[StepPersistence(store=store)])

    @agent.tool_plain
    def plot(metric: str) -> list[object]:  # pyright: ignore[reportUnusedFunction]
        return [f'chart of {metric}', _binary(chart_png(), media_type='image/png')]

    try:
        await agent.run('plot the export times', run_id=run_id, conversation_id=f'{run_id}-conv')
    finally:
        await store.aclose()


def _file(tmp_path: Path, run_id: str) -> list[str]:
    blobs = tmp_path / 'blobs'
    store = FileStepStore(tmp_path / 'runs', media_store=DiskMediaStore(blobs), media_threshold_bytes=256)
    run_coroutine(_run_agent(store, run_id))
    assert any(blobs.rglob('*')), 'the chart should have gone to the media store'
    return ['--store', f'file://{tmp_path / "runs"}', '--media', f'disk://?directory={blobs}']


def _postgres(tmp_path: Path, run_id: str) -> list[str]:
    del tmp_path
    url = _server('STEP_POSTGRES_URL', 'postgres-server.sh')
    run_coroutine(_run_agent(PostgresStepStore(dsn=url, media_threshold_bytes=256), run_id))
    return ['--store', url]


def _mongo(tmp_path: Path, run_id: str) -> list[str]:
    del tmp_path
    base = _server('STEP_MONGO_URL', 'mongo-server.sh').rstrip('/')
    database = f'ui_{run_id.replace("-", "_")}'
    run_coroutine(_run_agent(MongoStepStore(db_url=base, database=database, media_threshold_bytes=256), run_id))
    return ['--store', f'{base}/{database}']


STORES: dict[str, Callable[[Path, str], list[str]]] = {'file': _file, 'postgres': _postgres, 'mongo': _mongo}


@pytest.mark.parametrize('backend', sorted(STORES))
def test_a_run_and_its_media_on_every_store(backend: str, tmp_path: Path, serve: Callable[..., Any]) -> None:
    run_id = f'ui-{backend}-{uuid.uuid4().hex[:8]}'
    args = STORES[backend](tmp_path, run_id)
    ui = serve(*args)

    found = ui.get(f'/?q={run_id}')
    assert found.status == 303
    assert found.header('location') == f'/runs/{run_id}'
    overview = html.unescape(ui.get(f'/runs/{run_id}').text)
    assert 'plotter' in overview
    assert 'completed' in overview
    assert f"fork_run(store, run_id='{run_id}')" in overview
    if backend == 'file':
        assert "media_store=media_from_spec('disk', directory=" in overview
    if backend == 'postgres':
        assert ':<password>@' in overview  # the DSN's password is never shown
        password = urlsplit(args[1]).password
        assert password
        assert f':{password}@' not in overview
    listing = ui.get(f'/runs/{run_id}/snapshots').text
    seq = max(int(s) for s in re.findall(rf'/runs/{run_id}/snapshots/(\d+)"', listing))
    page = ui.get(f'/runs/{run_id}/snapshots/{seq}').text
    assert 'chart of export minutes' in page
    media = re.findall(rf'/runs/{run_id}/snapshots/{seq}/media/\d+/\d+/\d+', page)
    assert len(set(media)) == 1
    image = ui.get(media[0])
    assert image.header('content-type') == 'image/png'
    assert image.body == chart_png()
    timeline = ui.get(f'/runs/{run_id}/timeline').text
    assert 'tool_call_completed' in timeline
    assert 'no end' not in timeline
