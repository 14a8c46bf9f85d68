"""Workspace-wide pytest setup.

- The conformance kit's report plugin, on for every package's tests. pytest honours
  `pytest_plugins` only in the conftest.py at the rootdir, so the opt-in lives here rather than in
  each package's tests/conftest.py.
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


def _unset_event_loop() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        asyncio.set_event_loop(None)


def pytest_configure(config: pytest.Config) -> None:
    _unset_event_loop()
