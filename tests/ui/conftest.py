"""Fixtures for the web inspector: stores filled by real agent runs, `stepcore ui` in a child process, a browser.

The browser is Debian's Chromium driven through its own chromedriver (`apt-get install -y chromium
chromium-driver`); selenium is pointed at both, so nothing is downloaded at run time. Screenshots
go to `$STEPCORE_UI_SCREENSHOTS`, else `build/ui-screenshots/` at the top of the checkout.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, CallDeferred, DeferredToolRequests, ModelRetry
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from rich.console import Console

from step_sqlite import SqliteStepStore
from stepcore import StepPersistence, answer_call
from stepcore.cli._loop import run_coroutine
from stepcore.cli.demo import run_demo
from stepcore.cli.demo_chart import chart_png

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path('/usr/bin/chromium')
CHROMEDRIVER = Path('/usr/bin/chromedriver')

HOSTILE = '<script>document.body.dataset.pwned = "script"</script><img src=x onerror="document.body.dataset.pwned=1">'
"""A tool return that would run code if the page did not escape it."""
SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'

_binary: Any = BinaryContent  # a pydantic dataclass: its constructor is not visible to type checkers


# -- the app in a child process -------------------------------------------------------------------


@dataclass
class Ui:
    base: str
    proc: subprocess.Popen[str]
    output: list[str]
    """What the server printed after its first line (read by a thread, so the pipe never fills)."""

    def get(self, path: str, *, method: str = 'GET', headers: dict[str, str] | None = None) -> Page:
        request = urllib.request.Request(self.base + path, method=method, headers=headers or {})
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(request, timeout=60) as response:
                return Page(response.status, dict(response.headers.items()), response.read())
        except urllib.error.HTTPError as error:
            return Page(error.code, dict(error.headers.items()), error.read())


@dataclass
class Page:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode('utf-8')

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def start_ui(*args: str) -> Ui:
    """`stepcore ui ARGS --port 0` in a child process, once it says where it listens."""
    env = {k: v for k, v in os.environ.items() if k != 'STEPCORE_STORE'}
    proc = subprocess.Popen(
        [sys.executable, '-m', 'stepcore.cli', 'ui', *args, '--port', '0'],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r'at (http://127\.0\.0\.1:\d+)/ \(read-only', line)
    if found is None:
        proc.kill()
        pytest.fail(f'stepcore ui did not start: {line}{proc.stdout.read()}')
    output: list[str] = []
    threading.Thread(target=lambda: output.extend(proc.stdout or ()), daemon=True).start()
    return Ui(base=found.group(1), proc=proc, output=output)


def stop_ui(ui: Ui) -> None:
    ui.proc.terminate()
    try:
        ui.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        ui.proc.kill()
        ui.proc.wait()
    if ui.proc.stdout is not None:
        ui.proc.stdout.close()


@pytest.fixture(scope='session')
def serve() -> Iterator[Callable[..., Ui]]:
    """Start `stepcore ui ARGS` (stopped at the end of the session)."""
    started: list[Ui] = []

    def start(*args: str) -> Ui:
        ui = start_ui(*args)
        started.append(ui)
        return ui

    yield start
    for ui in started:
        stop_ui(ui)


# -- stores -----------------------------------------------------------------------------------------


@pytest.fixture(scope='session')
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The database `stepcore demo` leaves: a run killed in send_email, its delegate, the run resuming it."""
    path = tmp_path_factory.mktemp('ui-demo') / 'demo.db'
    run_demo(path, console=Console(file=io.StringIO()))
    return path


@pytest.fixture(scope='session')
def demo_ui(demo_db: Path, serve: Callable[..., Ui]) -> Ui:
    return serve('--store', f'sqlite:///{demo_db}')


@pytest.fixture(scope='session')
def killed_ui(tmp_path_factory: pytest.TempPathFactory, serve: Callable[..., Ui]) -> Ui:
    """The database `stepcore demo` leaves before it resumes: a run killed in send_email, as it stands."""
    path = tmp_path_factory.mktemp('ui-killed') / 'demo.db'
    run_demo(path, console=Console(file=io.StringIO()), resume=False)
    return serve('--store', f'sqlite:///{path}')


def _hostile_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returns:
        args = {'url': 'https://example.com/<img src=x onerror=alert(1)>'}
        return ModelResponse(parts=[ToolCallPart('fetch_page', args, tool_call_id='call-fetch')])
    if len([r for r in returns if r.outcome == 'success']) < 2:
        return ModelResponse(parts=[ToolCallPart('check', {'attempt': len(returns)}, tool_call_id='call-check')])
    return ModelResponse(parts=[TextPart('done: </pre></div><b>not bold</b>')])


async def _fill_hostile(database: Path) -> None:
    # A low media threshold sends the chart through the store's media store (its `media` table).
    store = SqliteStepStore(database=database, media_threshold_bytes=256)
    agent = Agent(FunctionModel(_hostile_model), name='<i>scraper</i>', capabilities=[StepPersistence(store=store)])
    tries: list[int] = []

    @agent.tool_plain
    def fetch_page(url: str) -> list[object]:  # pyright: ignore[reportUnusedFunction]
        return [HOSTILE, _binary(chart_png(), media_type='image/png'), _binary(SVG, media_type='image/svg+xml')]

    @agent.tool_plain
    def check(attempt: int) -> str:  # pyright: ignore[reportUnusedFunction]
        tries.append(attempt)
        if len(tries) == 1:
            raise ModelRetry('the page was still loading: try again')
        return 'checked'

    try:
        await agent.run('Fetch the page <b>now</b>', run_id='hostile-1', conversation_id='hostile')
    finally:
        await store.aclose()


@pytest.fixture(scope='session')
def hostile_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose stored strings are HTML and script, with an image in the media store, an SVG and a retry."""
    path = tmp_path_factory.mktemp('ui-hostile') / 'hostile.db'
    run_coroutine(_fill_hostile(path))
    return path


@pytest.fixture(scope='session')
def hostile_ui(hostile_db: Path, serve: Callable[..., Ui]) -> Ui:
    return serve('--store', f'sqlite:///{hostile_db}')


def _approval_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    del info
    if any(isinstance(p, ToolReturnPart) and p.tool_call_id == 'call-drop' for m in messages for p in m.parts):
        return ModelResponse(parts=[TextPart('done')])
    return ModelResponse(
        parts=[
            ToolCallPart('count_rows', {'table': 'users'}, tool_call_id='call-count'),
            ToolCallPart('drop_table', {'name': 'users', 'cascade': True}, tool_call_id='call-drop'),
            ToolCallPart('ask_owner', {'question': 'keep a backup?'}, tool_call_id='call-ask'),
        ]
    )


async def _fill_waiting(database: Path) -> None:
    store = SqliteStepStore(database=database)
    agent = Agent(
        FunctionModel(_approval_model),
        name='dba',
        output_type=[str, DeferredToolRequests],
        capabilities=[StepPersistence(store=store, answer_within={'drop_table': timedelta(hours=4)})],
    )

    @agent.tool_plain
    def count_rows(table: str) -> int:  # pyright: ignore[reportUnusedFunction]
        return 3

    @agent.tool_plain(requires_approval=True)
    def drop_table(name: str, cascade: bool) -> str:  # pyright: ignore[reportUnusedFunction]
        return f'dropped {name}'

    @agent.tool_plain
    def ask_owner(question: str) -> str:  # pyright: ignore[reportUnusedFunction]
        raise CallDeferred

    try:
        result = await agent.run('Drop the users table', run_id='approval-run-1')
        assert isinstance(result.output, DeferredToolRequests)
        await answer_call(store, run_id='approval-run-1', tool_call_id='call-ask', result='yes, keep one', by='ops')
    finally:
        await store.aclose()


@pytest.fixture(scope='session')
def waiting_ui(tmp_path_factory: pytest.TempPathFactory, serve: Callable[..., Ui]) -> Ui:
    """A run paused on an approval nobody gave yet (with a deadline) and an outside call answered already."""
    path = tmp_path_factory.mktemp('ui-waiting') / 'waiting.db'
    run_coroutine(_fill_waiting(path))
    return serve('--store', f'sqlite:///{path}')


# -- the browser ------------------------------------------------------------------------------------


@pytest.fixture(scope='session')
def screenshots() -> Path:
    folder = Path(os.environ.get('STEPCORE_UI_SCREENSHOTS') or ROOT / 'build' / 'ui-screenshots')
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope='session')
def browser() -> Iterator[Any]:
    """Headless Chromium from Debian through /usr/bin/chromedriver: selenium fetches nothing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f'{", ".join(missing)} not found: install them with `apt-get install -y chromium chromium-driver`')
    os.environ['SE_OFFLINE'] = 'true'  # selenium-manager, if ever consulted, must not download anything
    profile = tempfile.mkdtemp(prefix='stepcore-ui-chromium-')
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in (
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--disable-dev-shm-usage',
        f'--user-data-dir={profile}',
        '--window-size=1280,900',
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def full_screenshot(driver: Any, path: Path) -> None:
    """The whole page as a PNG, however long it is."""
    import base64

    height = int(driver.execute_script('return document.documentElement.scrollHeight'))
    driver.execute_cdp_cmd(
        'Emulation.setDeviceMetricsOverride',
        {'width': 1280, 'height': min(max(height, 600), 6000), 'deviceScaleFactor': 1, 'mobile': False},
    )
    try:
        shot = driver.execute_cdp_cmd('Page.captureScreenshot', {'format': 'png', 'captureBeyondViewport': True})
        path.write_bytes(base64.b64decode(shot['data']))
    finally:
        driver.execute_cdp_cmd('Emulation.clearDeviceMetricsOverride', {})


@pytest.fixture
def shoot(browser: Any, screenshots: Path) -> Callable[[str], Path]:
    """Save the browser's whole page as `<screenshots>/<name>.png`."""

    def save(name: str) -> Path:
        path = screenshots / f'{name}.png'
        full_screenshot(browser, path)
        return path

    return save
