"""`EngineStore`: every `StepStore` method, written once over a backend's port.

The engine owns the mechanisms: encoding records into rows and back, run-id checks and
registration rules, idempotency keys, incremental snapshots (which messages are new, the stale
check, retention), the order of writes (the crash rule), damage handling and error wrapping. A
backend subclasses `EngineStore` and passes its port (`stepcore.engine._port`), which only does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar, cast

from stepcore.common.damage import DamagedRecordError, skip_damaged
from stepcore.common.encryption import Encryption
from stepcore.common.features import (
    ENCRYPTION,
    ENGINE_PORT,
    LEASES,
    MEDIA_EXTERNALIZATION,
    SNAPSHOT_RETENTION,
    require_feature,
)
from stepcore.engine._driver import Driver, single
from stepcore.engine._history import HistoryIndex
from stepcore.engine._ops import DeleteRun, GetRun, InsertRun, ListRunIds, ListRuns, RunRow
from stepcore.engine._port import Port, check_text
from stepcore.engine._rows import RowCodec
from stepcore.engine._seal import Sealer
from stepcore.engine._store_leases import StoreLeases
from stepcore.engine._store_reads import StoreReads
from stepcore.engine._store_upkeep import StoreUpkeep
from stepcore.engine._store_writes import StoreWrites
from stepcore.media.encrypting import EncryptingMediaStore
from stepcore.media.protocol import MediaStore, MediaStoreOption, check_media_store, resolve_media_store
from stepcore.media.walker import DEFAULT_MEDIA_THRESHOLD_BYTES, MediaWalker
from stepcore.store.leases import LeaseState
from stepcore.store.lifecycle import RunKey, RunQuery, RunStatus, collect_runs, sort_time
from stepcore.store.models import RunRecord
from stepcore.store.registration import check_registration
from stepcore.store.retention import check_max_snapshots

__all__ = ('EngineStore',)


class EngineStore(StoreWrites, StoreReads, StoreUpkeep, StoreLeases):
    """A `StepStore` over a port: subclass it, build your port, and call `super().__init__(port, ...)`.

    `max_snapshots_per_run` needs the feature `snapshot_retention` and `media_store` /
    `media_threshold_bytes` the feature `media_externalization` to be declared in `features`: an
    undeclared one is refused with `NotImplementedError`. `media_store` takes a media store, `None`
    or `'auto'`, which here means none: a store with a default media store of its own resolves
    `'auto'` to it (`stepcore.media.resolve_media_store`) before calling this.

    Its jobs are parts it derives from: writes (`_store_writes.py`), reads (`_store_reads.py`),
    maintenance (`_store_upkeep.py`) and leases (`_store_leases.py`), over the state they share
    (`_store_base.py`). Its own state and the helpers its parts share start with `_engine_`
    (`self._engine_driver`: a name-mangled one would differ from part to part), the others are
    name-mangled (`self.__save` in `_store_writes.py`), and a backend's store keeps its own name-mangled too: users
    subclass stores and set private attributes of their own, which must never replace the store's
    (docs/engine.md, "The store's own state").
    """

    features: ClassVar[frozenset[str]] = frozenset({ENGINE_PORT})
    implied_features: ClassVar[frozenset[str]] = frozenset({ENGINE_PORT})

    def __init__(
        self,
        port: Port,
        *,
        max_snapshots_per_run: int | None = None,
        media_store: MediaStoreOption = None,
        media_threshold_bytes: int | None = None,
        history_runs: int = 256,
        encryption: Encryption | None = None,
        default_media_store: Callable[[], MediaStore | None] | None = None,
    ) -> None:
        """`media_store` is the option as a user gave it: `'auto'` is `default_media_store()` (the
        backend's own media store, made only then; no media store when the backend has none), `None`
        is none, a media store is used as it is."""
        driver = Driver(port, type(self).__name__)
        media_store = resolve_media_store(
            media_store, default=default_media_store or (lambda: None), owner=type(self).__name__
        )
        if max_snapshots_per_run is not None:
            require_feature(self, SNAPSHOT_RETENTION, option='max_snapshots_per_run')
        if media_store is not None or media_threshold_bytes is not None:
            require_feature(self, MEDIA_EXTERNALIZATION, option='media_store / media_threshold_bytes')
        if encryption is not None:
            require_feature(self, ENCRYPTION, option='encryption')
        if encryption is not None and not isinstance(encryption, Encryption):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f'encryption= takes a stepcore.Encryption, got {type(encryption).__name__}')
        self.encryption: Encryption | None = encryption
        self._engine_sealer = Sealer(encryption)
        self._engine_rows = RowCodec(self._engine_sealer, self._engine_where)
        self._engine_driver = driver
        self.max_snapshots_per_run = check_max_snapshots(max_snapshots_per_run)
        self.media_store: MediaStore | None = media_store
        threshold = DEFAULT_MEDIA_THRESHOLD_BYTES if media_threshold_bytes is None else media_threshold_bytes
        blobs: Any = media_store
        if encryption is not None and media_store is not None:
            blobs = EncryptingMediaStore(media_store, encryption)
        self._engine_history = HistoryIndex(MediaWalker(blobs, threshold), max_runs=history_runs)

    @classmethod
    def check_options(
        cls,
        *,
        max_snapshots_per_run: object = None,
        media_store: object = None,
        media_threshold_bytes: object = None,
    ) -> None:
        """Refuse a bad engine option with the error `__init__` would raise, before a backend opens
        anything it would then have to close (a client, a connection pool)."""
        check_max_snapshots(cast(int | None, max_snapshots_per_run))
        MediaWalker(None, cast(int | None, media_threshold_bytes))
        check_media_store(media_store, owner=cls.__name__)

    @property
    def port(self) -> Port:
        """The port the store's I/O goes to (setting it runs the store on another port)."""
        return self._engine_driver.port

    @port.setter
    def port(self, port: Port) -> None:
        self._engine_driver = Driver(port, type(self).__name__)

    def __repr__(self) -> str:
        return f'<{type(self).__name__} on {self._engine_driver.port.describe()}>'

    def is_transient(self, error: BaseException) -> bool:
        """Whether `error`, raised by this store, is a passing failure (a timeout, a lost connection,
        a lock another session holds, a conflict): the same call a little later may succeed. The
        store already made it again for a while before raising it."""
        return isinstance(error, Exception) and self._engine_driver.port.transient(error, write=False)

    # -- runs ---------------------------------------------------------------------------------

    async def register_run(self, record: RunRecord) -> None:
        run_id = self._engine_run_id(record.run_id)
        for value, what in ((record.conversation_id, 'conversation_id'), (record.parent_run_id, 'parent_run_id')):
            if value is not None:
                check_text(value, what)
        row = self._engine_rows.run_row(record, run_id)
        existing = cast(RunRow | None, await self._engine_driver.write_op([run_id], InsertRun(row)))
        if existing is not None:
            check_registration(self._engine_rows.decode_run(existing), record)

    async def get_run(self, run_id: str) -> RunRecord | None:
        run_id = self._engine_run_id(run_id)
        answer, tally = await self._engine_read_counted(run_id, lambda: single(GetRun(run_id)))
        row = cast(RunRow | None, answer)
        if row is None and tally is not None and tally.has_records:
            raise DamagedRecordError(
                run_id=run_id,
                record='run',
                where=self._engine_where(),
                reason='records are missing: the run has records and a lease, and its run record is not found',
            )
        return self._engine_rows.decode_run(row) if row is not None else None

    async def list_runs(
        self,
        *,
        conversation_id: str | None = None,
        parent_run_id: str | None = None,
        agent_name: str | None = None,
        status: RunStatus | None = None,
        started_after: datetime | None = None,
        started_before: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        newest_first: bool = False,
    ) -> list[RunRecord]:
        query = RunQuery.make(
            conversation_id=conversation_id,
            parent_run_id=parent_run_id,
            agent_name=agent_name,
            status=status,
            started_after=started_after,
            started_before=started_before,
            limit=limit,
            cursor=cursor,
            newest_first=newest_first,
        )

        async def fetch(after: RunKey | None, batch: int | None) -> tuple[list[RunRecord], bool, RunKey | None]:
            op = ListRuns(
                conversation_id=query.conversation_id,
                parent_run_id=query.parent_run_id,
                agent_name=query.agent_name,
                started_after=query.started_after,
                started_before=query.started_before,
                after=after,
                limit=batch,
                newest_first=query.newest_first,
            )
            rows = cast(Sequence[RunRow], await self._engine_driver.read_op(None, op))
            found: list[RunRecord] = []
            for row in rows:
                try:
                    found.append(self._engine_rows.decode_run(row))
                except DamagedRecordError as error:
                    skip_damaged(error)
            keys = [(sort_time(row.started_at), row.run_id) for row in rows]
            last = (min(keys) if query.newest_first else max(keys)) if keys else None
            return found, batch is None or len(rows) != batch, last

        return await collect_runs(query, fetch, self._status_of)

    async def delete_run(self, run_id: str) -> bool:
        run_id = self._engine_run_id(run_id)
        try:
            return bool(await self._engine_driver.write_op([run_id], DeleteRun(run_id)))
        finally:
            self._engine_history.forget(run_id)

    # Beside `list_runs`, which it stands in for (`stepcore.store.contract.EXTENSIONS`): in a part
    # `EngineStore` derives from, `own_extension` would take `list_runs` as overridden below it.
    async def stored_run_ids(self) -> list[str]:
        """The id of every run this store holds a run record or a snapshot of, sorted.

        Unlike `list_runs`, a run whose record is damaged or missing (a snapshot saved without
        `register_run`, a run killed after it took its lease and before it registered) is included:
        maintenance must not overlook what it cannot read.
        """
        found = set(cast(Sequence[str], await self._engine_driver.read_op(None, ListRunIds())))
        if LEASES in type(self).features:
            live = (LeaseState.RUNNING, LeaseState.WAITING, LeaseState.PENDING, LeaseState.RESUMED)
            found |= {lease.run_id for lease in await self.list_leases(live)}
        return sorted(found)

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        await self._engine_driver.close()
