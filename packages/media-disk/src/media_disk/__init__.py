"""media-disk: a content-addressed, on-disk `MediaStore` for stepcore."""

from __future__ import annotations

from .store import SIDECAR_SUFFIX, DiskMediaStore

__all__ = ('SIDECAR_SUFFIX', 'DiskMediaStore')
