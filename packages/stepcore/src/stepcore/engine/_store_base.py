"""What the parts of `EngineStore` share: the store's state, and the helpers more than one part calls.

`EngineStore` (`_engine_store.py`) is built from one class per job: writes (`_store_writes.py`),
reads (`_store_reads.py`), leases (`_store_leases.py`) and whole-store maintenance
(`_store_upkeep.py`). Each derives from `EngineBase`, which declares the state `EngineStore.__init__`
sets (the driver, the row codec, the sealer, the history index) and holds the helpers several of them
call: the run-id check, where the store is, a lease read back, a run's start point. A name several
parts share cannot be name-mangled (Python mangles it per class), so each starts with `_engine_`,
unlike the private names users' subclasses give their own state (`_driver`, `_db`).
"""

from __future__ import annotations

from typing import Final, cast

from stepcore.common.damage import DamagedRecordError, decoded
from stepcore.engine._driver import Driver
from stepcore.engine._history import HistoryIndex
from stepcore.engine._ops import GetLeaseStart, LeaseRead
from stepcore.engine._rows import RowCodec
from stepcore.engine._seal import MessageDamage, Sealer
from stepcore.store.leases import Lease, decode_lease_body
from stepcore.store.step_store import StepStore

__all__ = ('MAX_TTL', 'EngineBase')


MAX_TTL: Final = 10.0 * 365 * 24 * 3600
"""The longest lease a swap takes: ten years (longer ones overflow some clocks)."""


class EngineBase(StepStore):
    """The state and shared helpers of `EngineStore`'s parts; `EngineStore.__init__` sets the state."""

    max_snapshots_per_run: int | None
    _engine_driver: Driver
    _engine_rows: RowCodec
    _engine_sealer: Sealer
    _engine_history: HistoryIndex

    # -- checks ---------------------------------------------------------------------------------

    def _engine_run_id(self, run_id: object) -> str:
        return self._engine_driver.port.check_run_id(run_id)

    def _engine_where(self) -> str:
        return self._engine_driver.port.describe()

    # -- a run's lease and start point (read by the leases, the writes and maintenance) -----------

    def _engine_lease(self, run_id: str, read: LeaseRead) -> Lease | None:
        row = read.row
        if row is None:
            return None
        try:
            return decode_lease_body(run_id, row.epoch, row.state, row.expires, read.now, row.body)
        except (ValueError, TypeError, KeyError) as error:
            raise DamagedRecordError(
                run_id=run_id, record='lease', where=self._engine_where(), reason=f'{type(error).__name__}: {error}'
            ) from None

    async def _engine_start(self, run_id: str) -> list[bytes] | None:
        """The stored bodies of the run's start point, checked (`DamagedRecordError` naming it); `None`: none."""
        blob = cast(bytes | None, await self._engine_driver.read_op(run_id, GetLeaseStart(run_id)))
        if blob is None:
            return None

        def opened() -> list[bytes]:
            head, _, rest = bytes(blob).partition(b'\n')
            bodies = rest.split(b'\n') if rest else []
            try:
                return self._engine_sealer.open_nodes(run_id, bodies, head.decode() or None, sealed=True)
            except MessageDamage as error:
                raise ValueError(f'message {error.position} is damaged: {error.reason}') from error

        return decoded(opened, run_id=run_id, record='start point', where=self._engine_where())
