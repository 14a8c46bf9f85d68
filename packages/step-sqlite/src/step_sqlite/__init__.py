"""step-sqlite: the embedded SQLite `StepStore` and `MediaStore` for stepcore."""

from __future__ import annotations

from .media import SqliteMediaStore
from .store import SqliteStepStore

__all__ = ('SqliteMediaStore', 'SqliteStepStore')

__version__ = '0.1.0'
