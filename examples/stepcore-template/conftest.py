"""Turns on the conformance kit's pytest plugin: its closing report, with a verdict per feature.

The kit never loads itself; `pytest_plugins` must sit in the conftest.py at the rootdir (here,
next to pyproject.toml), since pytest refuses it in a conftest.py further down.
"""

pytest_plugins = ['stepcore_conformance']
