"""A stepcore step store on the storage engine, one JSON file per record."""

from __future__ import annotations

from .store import TemplatePort, TemplateStepStore

__all__ = ('TemplatePort', 'TemplateStepStore')
