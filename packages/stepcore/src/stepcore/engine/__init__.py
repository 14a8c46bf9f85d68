"""The storage engine: one implementation of every store mechanism, over a small port per backend.

What other layers and backends use is handed on here (backends take it from `stepcore.backend`);
the modules that implement it are private:

- `EngineStore` (`_engine_store.py`): the `StepStore` a backend subclasses: the public API.
- `_store_writes.py`, `_store_reads.py`, `_store_leases.py`, `_store_upkeep.py`: `EngineStore`'s jobs
  (writes, reads, leases, whole-store maintenance), one class each, which it derives from.
- `_store_base.py`: the state and the helpers those classes share.
- `_rows.py`, `_seal.py`: the row codec: records into rows (bodies checked, sealed) and back.
- `_driver.py`, `_group.py`: run plans on a port, in transactions, inline or grouped.
- `SyncPort` / `AsyncPort` (`_port.py`): the I/O a backend implements, one method per operation.
- `PipelinedPort`, `Ask`, `NodeIdBlocks` (`_pipeline.py`): what network ports share: reads sent
  together, message node ids reserved in blocks.
- `ops` (`_ops.py`): the rows and operations a port deals in.
- `_plans.py`: the mechanisms themselves, as plans of operations.
- `_history.py`: message histories stored as chains of nodes, and how histories are compared.
- `_retry.py`: passing failures (timeouts, conflicts) made again, with growing random waits.
- `_sql.py`: the engine's event listing as an SQL window, for the SQL backends.
- `memory.py`: `InMemoryStepStore`, the engine over dictionaries.
- `faults.py`: fault injection at write boundaries, for crash tests.
"""

from __future__ import annotations

from stepcore.common.damage import DamagedRecordError
from stepcore.engine import _ops as ops
from stepcore.engine._engine_store import EngineStore
from stepcore.engine._history import TAIL_RECHECK, shares_prefix, starts_with, trusted_prefix
from stepcore.engine._pipeline import Ask, NodeIdBlocks, PipelinedPort
from stepcore.engine._plans import Fenced, KeyConflict, StaleHistory, pruned_with
from stepcore.engine._port import AsyncPort, Port, SyncPort, check_text
from stepcore.engine._retry import backoff, retrying
from stepcore.engine._rows import EFFECT_FIELDS_IN_ROW, EVENT_FIELDS_IN_ROW, sealed_size
from stepcore.engine._seal import HEAD_KEY, Sealer
from stepcore.engine._sql import event_window

__all__ = (
    'EFFECT_FIELDS_IN_ROW',
    'EVENT_FIELDS_IN_ROW',
    'HEAD_KEY',
    'TAIL_RECHECK',
    'Ask',
    'AsyncPort',
    'DamagedRecordError',
    'EngineStore',
    'Fenced',
    'KeyConflict',
    'NodeIdBlocks',
    'PipelinedPort',
    'Port',
    'Sealer',
    'StaleHistory',
    'SyncPort',
    'backoff',
    'check_text',
    'event_window',
    'ops',
    'pruned_with',
    'retrying',
    'sealed_size',
    'shares_prefix',
    'starts_with',
    'trusted_prefix',
)
