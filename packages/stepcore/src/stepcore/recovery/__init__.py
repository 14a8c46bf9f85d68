"""Recovery: what a crash or a pause left of a run, settling it, and resuming it once.

- `inspection.py`: `inspect_recovery`, the report of what a store knows about a run;
- `resolution.py`: `resolve_run` and the hand settlements; `chains.py`, `ledger.py`, `policies.py`;
- `paused.py`, `answers.py`: runs paused on deferred tool calls, their answers, `resume_run`;
- `continuing.py`: `continue_run` and `fork_run`;
- `fleet.py`, `standing.py`: orphans resumed by a fleet, and how a run stands.
"""

from __future__ import annotations

from stepcore.recovery.inspection import RecoveryInspection, RecoveryReport, inspect_recovery

__all__ = ('RecoveryInspection', 'RecoveryReport', 'inspect_recovery')
