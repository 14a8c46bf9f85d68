"""Applying a batch of event and ledger writes to any store."""

from __future__ import annotations

from .contract import write_records
from .protocols import check_writes

__all__ = ('apply_writes', 'check_writes')

apply_writes = write_records
"""Save a snapshot and apply event and ledger writes to any store (`stepcore.contract.write_records`)."""
