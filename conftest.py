"""Workspace-wide pytest setup.

- The conformance kit's report plugin, on for every package's tests. pytest honours
  `pytest_plugins` only in the conftest.py at the rootdir, so the opt-in lives here rather than in
  each package's tests/conftest.py.
- Figures a test reports: a test calls `record_property(FIGURES, line)` (the exactly-once kill test
  does, with its kill counts) and the line is printed at the end of the run, so a CI log shows it
  without `-s`.
- No implicit event loop. Before each async test pytest-asyncio saves "the current loop" with
  `asyncio.get_event_loop()`, which on Python 3.11-3.13 creates a loop when none was set and
  never closes it; the loop is then collected during whichever later test replaces it, and its
  `ResourceWarning` fails that test. Marking the main thread's loop as explicitly unset makes that
  call answer "no loop" instead of creating one.
"""

from __future__ import annotations

import asyncio
import warnings

import pytest

pytest_plugins = ['stepcore_conformance']

FIGURES = 'stepcore_figures'
"""The `record_property` name of a line of figures to print at the end of the run."""


def _unset_event_loop() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        asyncio.set_event_loop(None)


def pytest_configure(config: pytest.Config) -> None:
    _unset_event_loop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = [
        (report.nodeid, str(value))
        for outcome in ('passed', 'failed')
        for report in terminalreporter.stats.get(outcome, [])
        if isinstance(report, pytest.TestReport) and report.when == 'call'
        for name, value in report.user_properties
        if name == FIGURES
    ]
    if not lines:
        return
    terminalreporter.section('figures')
    for nodeid, line in lines:
        terminalreporter.write_line(f'{nodeid}:')
        for part in line.splitlines():
            terminalreporter.write_line(f'  {part}')
