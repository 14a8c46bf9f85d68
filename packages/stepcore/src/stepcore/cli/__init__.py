"""The `stepcore` command line."""

from __future__ import annotations

from stepcore.cli.root import app, main

__all__ = ('app', 'main')
