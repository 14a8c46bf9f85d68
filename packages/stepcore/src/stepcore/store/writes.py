"""Applying a batch of event and ledger writes to any store."""

from __future__ import annotations

from stepcore.store.arguments import check_writes
from stepcore.store.contract import write_records

__all__ = ('apply_writes', 'check_writes')

apply_writes = write_records
"""Save a snapshot and apply event and ledger writes to any store (`stepcore.store.contract.write_records`)."""
