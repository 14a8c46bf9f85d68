"""The storage engine: one implementation of every store mechanism, over a small port per backend.

- `EngineStore` (`store.py`): the `StepStore` a backend subclasses: the public API.
- `rows.py`: the row codec: records into rows (bodies sealed) and back, damage named.
- `driver.py`: runs plans on a port, in transactions, inline or grouped.
- `SyncPort` / `AsyncPort` (`port.py`): the I/O a backend implements, one method per operation.
- `PipelinedPort`, `Ask`, `NodeIdBlocks` (`pipeline.py`): what network ports share: reads sent
  together, message node ids reserved in blocks.
- `ops.py`: the rows and operations a port deals in.
- `plans.py`: the mechanisms themselves, as plans of operations.
- `damage.py`: `DamagedRecordError` and how listings pass over damaged records.
- `faults.py`: fault injection at write boundaries, for crash tests.
"""

from __future__ import annotations

from stepcore.engine.damage import DamagedRecordError
from stepcore.engine.pipeline import Ask, NodeIdBlocks, PipelinedPort
from stepcore.engine.plans import Fenced, KeyConflict, StaleHistory
from stepcore.engine.port import AsyncPort, Port, SyncPort, check_text
from stepcore.engine.store import EngineStore

__all__ = (
    'Ask',
    'AsyncPort',
    'DamagedRecordError',
    'EngineStore',
    'Fenced',
    'KeyConflict',
    'NodeIdBlocks',
    'PipelinedPort',
    'Port',
    'StaleHistory',
    'SyncPort',
    'check_text',
)
