"""Workspace-wide pytest setup: the conformance kit's report plugin, on for every package's tests.

pytest honours `pytest_plugins` only in the conftest.py at the rootdir, so the opt-in lives here
rather than in each package's tests/conftest.py.
"""

pytest_plugins = ['stepcore_conformance']
