"""A stepcore step store kept in plain Python dicts (a worked example of a backend plugin)."""

from __future__ import annotations

from .store import DictStepStore

__all__ = ('DictStepStore',)
