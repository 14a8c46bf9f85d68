"""step-file: a file-system `StepStore` for stepcore (one folder per run, incremental snapshots)."""

from __future__ import annotations

from .store import FileStepStore

__all__ = ('FileStepStore',)
