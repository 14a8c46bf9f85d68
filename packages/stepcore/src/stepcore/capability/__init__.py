"""The `StepPersistence` capability: what it records of a run, when, and how (`persistence.py`).

- `run_state.py`, `run_writer.py`: one run's state, and how its records reach the store;
- `snapshot_points.py`, `content_tracker.py`, `settled.py`: when a snapshot is due, and whether it is complete;
- `tool_calls.py`: a tool call's ledger entries, and `annotate_tool_effect`;
- `run_lease.py`, `pause.py`: the run's lease, and a run that pauses on deferred tool calls;
- `operations.py`, `events.py`, `context.py`: durable operations, `SnapshotSaved`, and context variables.
"""

from __future__ import annotations

from stepcore.capability.context import ActiveToolCall, active_tool_call
from stepcore.capability.operations import CAPABILITY_ID, OPERATION_NAMES
from stepcore.capability.persistence import SPEC_DEFAULTS, StepPersistence
from stepcore.capability.run_writer import DEFERRED_WRITE_DELAY

__all__ = (
    'CAPABILITY_ID',
    'DEFERRED_WRITE_DELAY',
    'OPERATION_NAMES',
    'SPEC_DEFAULTS',
    'ActiveToolCall',
    'StepPersistence',
    'active_tool_call',
)
