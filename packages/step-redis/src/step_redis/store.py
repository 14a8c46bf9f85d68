"""`RedisStepStore`: runs, events, snapshots and the tool-effect ledger in Redis.

The store is the stepcore engine over `RedisPort`. Key layout and row format: `keys.py`; the
server-side scripts: `scripts.py`.

A write is one Lua script. The engine's reads before a save (is the snapshot key applied, does the
node the new messages hang off exist, which snapshots does the run hold) go in one pipelined round
trip; the writes are collected and sent at commit as one `EVALSHA` of `COMMIT`, which checks the key
and the node again on the server and then writes the snapshot, the pruning, the ledger entries and
the events, all or nothing. A key recorded meanwhile makes it answer `conflict` (the engine runs its
plan again and finds the key applied), a node deleted meanwhile `stale` (the engine stores the
history whole). No lock is held, so a writer killed at any moment blocks nobody. Registering and
deleting a run are one script each, run at once.

Leases (feature `leases`): a run's lease is a hash, swapped by one script (`SWAP_LEASE`) on the
server's clock, and filed under the index of its state. A fenced write's `CheckLease` is one more
operation of its `COMMIT`, checked before the script's first write: a lease taken over meanwhile
makes it answer `fenced` and store nothing, without a round trip of its own.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, cast

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from stepcore.backend import (
    CHECKSUMS,
    DEFAULT_MEDIA_THRESHOLD_BYTES,
    ENCRYPTION,
    LEASES,
    MEDIA_EXTERNALIZATION,
    PERSISTENT,
    SNAPSHOT_RETENTION,
    Ask,
    Encryption,
    EngineStore,
    Fenced,
    KeyConflict,
    LeaseState,
    MediaStoreOption,
    NodeIdBlocks,
    PipelinedPort,
    SnapshotState,
    StaleHistory,
    ops,
    retrying,
)

from .client import ClientUser
from .keys import DEFAULT_KEY_PREFIX, EPOCH, Keys, moment, pack, text, unpack
from .media import RedisMediaStore
from .scripts import (
    COMMIT,
    DELETE_RUN,
    GET_LEASE,
    GET_NODES,
    INSERT_RUN,
    LEASE_FIELDS,
    LIST_LEASES,
    LIST_RUNS,
    LIST_SNAPSHOTS,
    SWAP_LEASE,
)

__all__ = ('RedisPort', 'RedisStepStore')

_COMPLETE: Final = SnapshotState.COMPLETE.value
_STATES: Final = frozenset(s.value for s in SnapshotState)
_LIVE: Final = tuple(s.value for s in LeaseState if s is not LeaseState.ENDED)
"""The lease states with an index (`<prefix>:leases:<state>`): every one but `ended`."""
_US: Final = 1_000_000
_LEASE_BATCH: Final = 1000
_WRITTEN_SECONDS: Final = 3600
"""How long a commit's id is kept (`RunKeys.writes`): far longer than a commit is ever sent again."""


def _lost_answer(error: Exception) -> bool:
    """A failure that passes and leaves the outcome of a command unknown: a timeout, a dropped
    connection (which includes a failover's)."""
    return isinstance(error, RedisTimeoutError | RedisConnectionError)


"""Leases read by one `LIST_LEASES` call."""


def _bytes(body: ops.Body) -> bytes:
    """An engine-encoded body as stored bytes (the engine hands over bytes when it writes)."""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    raise TypeError(f'step-redis stores encoded bodies, got {type(body).__name__}')


def _unreadable(error: ValueError) -> ops.Unreadable:
    return ops.Unreadable(f'the stored row cannot be split into its fields: {error}')


def _run_row(run_id: str, value: bytes) -> ops.RunRow:
    try:
        started, conversation, parent, body = unpack(value, 4)
        return ops.RunRow(run_id, moment(started), text(conversation), text(parent), body)
    except ValueError as error:
        return ops.RunRow(run_id, EPOCH, None, None, _unreadable(error))


def _effect_row(run_id: str, tool_call_id: str, value: bytes) -> ops.EffectRow:
    try:
        status, started, body = unpack(value, 3)
        return ops.EffectRow(run_id, tool_call_id, status.decode(), moment(started), body)
    except ValueError as error:
        return ops.EffectRow(run_id, tool_call_id, '', EPOCH, _unreadable(error))


def _event_row(run_id: str, seq: int, value: bytes) -> ops.EventRow:
    try:
        key, body = unpack(value, 2)
        return ops.EventRow(run_id, text(key), body, seq=seq)
    except ValueError as error:
        return ops.EventRow(run_id, None, _unreadable(error), seq=seq)


def _snapshot_row(run_id: str, seq: bytes, state: bytes, value: bytes) -> ops.SnapshotRow:
    try:
        # the third field is the step index, written for stores of earlier versions that read it
        head, length, _, body = unpack(value, 4)
        return ops.SnapshotRow(run_id, state.decode(), int(head) if head else None, int(length), body, seq=int(seq))
    except ValueError as error:
        return ops.SnapshotRow(run_id, state.decode(errors='replace'), None, 0, _unreadable(error), seq=int(seq))


def _whole(name: str, value: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f'its {name} {value!r} is not a whole number') from None


def _lease_row(run_id: str, fields: Sequence[bytes | None]) -> ops.LeaseRow:
    """A lease from its hash fields (`LEASE_FIELDS` order). A field missing or unreadable makes a row
    whose state names what is wrong, which the engine reports as a damaged lease."""
    epoch, state, host, expires, body = fields
    try:
        if epoch is None or state is None or host is None or expires is None:
            missing = [name for name, value in zip(LEASE_FIELDS, fields, strict=True) if value is None]
            raise ValueError(f'the lease has no {", ".join(missing)} field')
        return ops.LeaseRow(
            run_id, _whole('epoch', epoch), state.decode(), host.decode(), _whole('expires', expires) / _US, body or b''
        )
    except ValueError as error:
        return ops.LeaseRow(run_id, 0, f'<unreadable lease: {error}>', '', 0.0, body or b'')


def _pairs(flat: Sequence[Any]) -> list[tuple[bytes, bytes]]:
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


@dataclass(slots=True)
class _Batch:
    """One transaction: the runs it writes and the operations collected for `COMMIT`."""

    runs: list[str]
    keys: list[bytes]
    args: list[bytes | str | int] = field(default_factory=list[bytes | str | int])

    def run(self, run_id: str) -> int:
        try:
            return self.runs.index(run_id)
        except ValueError:
            raise RuntimeError(f'run {run_id!r} is written outside its transaction (runs {self.runs})') from None


class RedisPort(PipelinedPort):
    """The engine's operations as Redis commands and scripts under one key prefix (see the module docstring)."""

    gapless_events = True  # an event's seq is its position in the run's list

    name = 'Redis store'

    def __init__(self, client: Redis, keys: Keys) -> None:
        self._client = client
        self.keys = keys
        self._commit = client.register_script(COMMIT)
        self._insert_run = client.register_script(INSERT_RUN)
        self._list_runs = client.register_script(LIST_RUNS)
        self._delete_run = client.register_script(DELETE_RUN)
        self._list_snapshots = client.register_script(LIST_SNAPSHOTS)
        self._get_nodes = client.register_script(GET_NODES)
        self._get_lease = client.register_script(GET_LEASE)
        self._swap_lease = client.register_script(SWAP_LEASE)
        self._list_leases = client.register_script(LIST_LEASES)
        self._node_ids = NodeIdBlocks()

    def transient(self, error: Exception, *, write: bool) -> bool:
        """A read may be made again after a timeout or a dropped connection; a write's commit is
        sent again by the port itself (`transaction`), with its id, so the engine makes none again."""
        return not write and _lost_answer(error)

    def describe(self) -> str:
        kwargs = self._client.connection_pool.connection_kwargs
        where = kwargs.get('path') or f'{kwargs.get("host", "?")}:{kwargs.get("port", "?")}'
        return f"Redis keys '{self.keys.prefix}:*' in database {kwargs.get('db', 0)} at {where}"

    async def _script(self, script: Any, keys: Sequence[bytes], args: Sequence[bytes | str | int]) -> Any:
        return await script(keys=list(keys), args=list(args))

    async def pipeline(self, tx: Any, requests: Sequence[Any]) -> list[list[Any]]:
        """Send the requests' commands (each request a list of commands) in one pipeline; the
        replies of each request's commands, in order."""
        pipe = self._client.pipeline(transaction=False)
        for commands in requests:
            for command in commands:
                pipe.execute_command(*command)  # pyright: ignore[reportUnknownMemberType]
        replies: list[Any] = list(await pipe.execute())
        answers: list[list[Any]] = []
        for commands in requests:
            answers.append(replies[: len(commands)])
            del replies[: len(commands)]
        return answers

    @asynccontextmanager
    async def transaction(self, runs: Sequence[str]) -> AsyncIterator[_Batch]:
        """Collect the writes; on leaving, send them as one `COMMIT` (nothing is sent when the block raises)."""
        batch = _Batch(list(runs), [key for run_id in runs for key in self.keys.run(run_id)])
        yield batch
        if not batch.args:
            return
        # The commit is one script; an answer lost on the way (a timeout, a dropped connection)
        # leaves it unknown whether it ran, so it carries an id it records when it does, and is
        # sent again with the same id: a second run finds the id and applies nothing twice.
        args = [*batch.args, 'W', 0, uuid.uuid4().hex, _WRITTEN_SECONDS]
        answer = await retrying(lambda: self._script(self._commit, batch.keys, args), _lost_answer)
        if isinstance(answer, bytes) and answer.startswith(b'fenced:'):
            raise Fenced(batch.runs[int(answer[len(b'fenced:') :])])
        if answer == b'conflict':
            raise KeyConflict(f'snapshot key recorded meanwhile in {self.describe()}')
        if answer == b'stale':
            raise StaleHistory(', '.join(batch.runs))
        if answer != b'ok':  # pragma: no cover - the script answers nothing else
            raise RuntimeError(f'unexpected answer {answer!r} from the commit script in {self.describe()}')

    @asynccontextmanager
    async def reading(self, run_id: str | None) -> AsyncIterator[None]:
        yield None

    # -- the store itself ------------------------------------------------------------------------

    async def store_identity(self, tx: Any, op: ops.StoreIdentity) -> str:
        """`SET NX` of `op.new_id` (of sets at once, exactly one stores its id), then `GET`, in one round trip."""
        key = self.keys.identity
        ((_, found),) = await self.pipeline(tx, [[('SET', key, op.new_id, 'NX'), ('GET', key)]])
        return found.decode() if isinstance(found, bytes) else str(found)

    # -- runs ---------------------------------------------------------------------------------

    async def insert_run(self, tx: Any, op: ops.InsertRun) -> ops.RunRow | None:
        row = op.row
        value = pack(row.started_at.isoformat(), row.conversation_id, row.parent_run_id, _bytes(row.body))
        keys = self.keys
        index = [
            keys.conversation(row.conversation_id) if row.conversation_id is not None else keys.runorder,
            keys.parent(row.parent_run_id) if row.parent_run_id is not None else keys.runorder,
        ]
        flags = ['1' if row.conversation_id is not None else '', '1' if row.parent_run_id is not None else '']
        existing = await self._script(
            self._insert_run, [keys.runs, keys.runorder, keys.runseq, *index], [row.run_id, value, *flags]
        )
        return _run_row(row.run_id, existing) if existing is not None else None

    async def get_run(self, tx: Any, op: ops.GetRun) -> ops.RunRow | None:
        value = await self._client.hget(self.keys.runs, op.run_id)
        return _run_row(op.run_id, cast(bytes, value)) if value is not None else None

    async def list_runs(self, tx: Any, op: ops.ListRuns) -> list[ops.RunRow]:
        keys = self.keys
        if op.conversation_id is not None:
            index = keys.conversation(op.conversation_id)
        elif op.parent_run_id is not None:
            index = keys.parent(op.parent_run_id)
        else:
            index = keys.runorder
        found = await self._script(self._list_runs, [index, keys.runs], [])
        # The indexes are sorted sets in registration order, not by start: the lineage filter is the
        # server's, the time bounds, keyset and limit are applied here over the rows it answered.
        return op.pick(_run_row(run_id.decode(), value) for run_id, value in _pairs(found))

    async def list_run_ids(self, tx: Any, op: ops.ListRunIds) -> list[str]:
        found = {cast(bytes, r).decode() for r in await self._client.hkeys(self.keys.runs)}  # pyright: ignore[reportUnknownMemberType]
        start = len(self.keys.run('').snap)
        async for key in self._client.scan_iter(match=self.keys.run('*').snap, count=1000):
            found.add(cast(bytes, key)[start:].decode())
        return list(found)

    async def delete_run(self, tx: Any, op: ops.DeleteRun) -> bool:
        keys = self.keys
        for _ in range(10):
            value = cast(bytes | None, await self._client.hget(keys.runs, op.run_id))
            row = _run_row(op.run_id, value) if value is not None else None
            conversation = row.conversation_id if row is not None else None
            parent = row.parent_run_id if row is not None else None
            index = [
                keys.conversation(conversation) if conversation is not None else keys.runorder,
                keys.parent(parent) if parent is not None else keys.runorder,
            ]
            removed = int(
                await self._script(
                    self._delete_run,
                    [keys.runs, keys.runorder, *index, *keys.run(op.run_id), *map(keys.leases, _LIVE)],
                    [op.run_id, value or b''],
                )
            )
            if removed >= 0:
                return removed > 0
        raise RuntimeError(f'run {op.run_id!r} kept changing while it was being deleted in {self.describe()}: retry')

    # -- events and ledger --------------------------------------------------------------------

    async def put_events(self, tx: _Batch, op: ops.PutEvents) -> None:
        run = tx.run(op.run_id)
        for row in op.rows:
            tx.args += ['E', run, row.idempotency_key or '', pack(row.idempotency_key, _bytes(row.body))]

    async def list_events(self, tx: Any, op: ops.ListEvents) -> list[ops.EventRow]:
        # An event's seq is its position in the run's list, counted from 1.
        key = self.keys.run(op.run_id).ev
        start = op.after_seq or 0
        if op.limit is not None and op.newest:
            length = cast(int, await self._client.llen(key))
            start = max(start, length - op.limit)
        stop = -1 if op.limit is None or op.newest else start + op.limit - 1
        values = cast(list[bytes], await self._client.lrange(key, start, stop))
        return [_event_row(op.run_id, seq, value) for seq, value in enumerate(values, start=start + 1)]

    async def put_effects(self, tx: _Batch, op: ops.PutEffects) -> None:
        for row in op.rows:
            value = pack(row.status, row.started_at.isoformat(), _bytes(row.body))
            tx.args += ['F', tx.run(row.run_id), row.tool_call_id, value]

    async def list_effects(self, tx: Any, op: ops.ListEffects) -> list[ops.EffectRow] | int:
        run = self.keys.run(op.run_id)
        if op.count and op.tool_call_id is None:  # one hash field per call
            return await self.fetch(tx, Ask([('HLEN', run.fx)], lambda replies: int(replies[0])))
        if op.tool_call_id is not None:
            value = cast(bytes | None, await self._client.hget(run.fx, op.tool_call_id))
            return [_effect_row(op.run_id, op.tool_call_id, value)] if value is not None else []
        order, rows = await self.fetch(
            tx, Ask([('LRANGE', run.fxorder, 0, -1), ('HGETALL', run.fx)], lambda replies: (replies[0], replies[1]))
        )
        by_id = cast(dict[bytes, bytes], rows)
        found = [
            _effect_row(op.run_id, call.decode(), by_id[call]) for call in cast(list[bytes], order) if call in by_id
        ]
        return found

    # -- snapshots ----------------------------------------------------------------------------

    def ask_snapshot_key_applied(self, op: ops.SnapshotKeyApplied) -> Ask[bool]:
        return Ask([('SISMEMBER', self.keys.run(op.run_id).snapkeys, op.key)], lambda r: bool(r[0]))

    def ask_node_exists(self, op: ops.NodeExists) -> Ask[bool]:
        return Ask([('HEXISTS', self.keys.run(op.run_id).node, op.node)], lambda r: bool(r[0]))

    def ask_snapshot_states(self, op: ops.SnapshotStates) -> Ask[list[tuple[int, str]]]:
        def answer(replies: list[Any]) -> list[tuple[int, str]]:
            states = cast(dict[bytes, bytes], replies[0])
            # A state that is no known one (a damaged entry) is left to stay, never pruned by mistake.
            found = [(int(seq), state.decode(errors='replace')) for seq, state in states.items()]
            return sorted((seq, state) for seq, state in found if state in _STATES)

        return Ask([('HGETALL', self.keys.run(op.run_id).snapstate)], answer)

    async def _reserve_node_ids(self, count: int) -> range:
        last = int(await self._client.incrby(self.keys.nodeids, count))
        return range(last - count + 1, last + 1)

    async def put_snapshot(self, tx: _Batch, op: ops.PutSnapshot) -> list[int]:
        nodes = await self._node_ids.take(len(op.bodies), self._reserve_node_ids)
        row = op.row
        head = nodes[-1] if nodes else op.parent
        body = _bytes(row.body)
        tx.args += [
            'S',
            tx.run(op.run_id),
            op.key or '',
            '' if op.parent is None else op.parent,
            row.state,
            '1' if row.state == _COMPLETE else '',
            pack('' if head is None else str(head), str(row.length), str(ops.legacy_step_index(body)), body),
            len(nodes),
        ]
        parent = op.parent
        for node, body in zip(nodes, op.bodies, strict=True):
            tx.args += [node, pack('' if parent is None else str(parent), body)]
            parent = node
        return nodes

    async def delete_snapshots(self, tx: _Batch, op: ops.DeleteSnapshots) -> None:
        tx.args += ['D', tx.run(op.run_id), len(op.seqs), *op.seqs]

    async def list_snapshots(self, tx: Any, op: ops.ListSnapshots) -> list[ops.SnapshotRow]:
        run = self.keys.run(op.run_id)
        index = run.snapdone if op.complete_only else run.snapseq
        flat = await self._script(self._list_snapshots, [index, run.snap, run.snapstate], ['1' if op.newest else ''])
        return [_snapshot_row(op.run_id, flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

    async def get_nodes(self, tx: Any, op: ops.GetNodes) -> Mapping[int, ops.Node]:
        args = [value for head, length in op.chains for value in (head, length)]
        found: dict[int, ops.Node] = {}
        for node, value in _pairs(await self._script(self._get_nodes, [self.keys.run(op.run_id).node], args)):
            try:
                parent, body = unpack(value, 2)
                found[int(node)] = (int(parent) if parent else None, body)
            except ValueError:
                continue  # a node that cannot be split is missing to the engine, which reports the chain
        return found

    # -- leases: each swap is one script on the server's clock; the fence is part of COMMIT -------

    async def get_lease(self, tx: Any, op: ops.GetLease) -> ops.LeaseRead:
        now, *fields = await self._script(self._get_lease, [self.keys.run(op.run_id).lease], [])
        return ops.LeaseRead(_lease_row(op.run_id, fields) if fields else None, int(now) / _US)

    async def swap_lease(self, tx: Any, op: ops.SwapLease) -> ops.LeaseSwap:
        row = op.row
        if row.state == LeaseState.ENDED.value:
            slot = 0
        elif row.state in _LIVE:
            slot = _LIVE.index(row.state) + 1
        else:
            raise ValueError(f'lease state {row.state!r} cannot be stored: use a stepcore.store.leases.LeaseState')
        if not math.isfinite(op.ttl):
            raise ValueError(f'ttl={op.ttl!r} cannot hold a lease: pass a finite number of seconds')
        run = self.keys.run(op.run_id)
        body = row.body if isinstance(row.body, bytes) else row.body.encode()
        args: list[bytes | str | int] = [
            op.run_id,
            '' if op.expect is None else op.expect,
            '1' if op.expired else '',
            row.epoch,
            row.state,
            row.host,
            round(op.ttl * _US),
            body,
            slot,
            '' if op.start is None else '1',
            b'' if op.start is None else op.start,
            '' if op.expect_expires is None else str(round(op.expect_expires * _US)),
        ]
        swapped, now, *fields = await self._script(
            self._swap_lease, [run.lease, run.leasestart, *map(self.keys.leases, _LIVE)], args
        )
        read = ops.LeaseRead(_lease_row(op.run_id, fields) if fields else None, int(now) / _US)
        return ops.LeaseSwap(swapped == b'1', read)

    async def list_leases(self, tx: Any, op: ops.ListLeases) -> tuple[list[ops.LeaseRow], float]:
        # The indexes name the runs; one script per batch of them reads their leases and the clock
        # (every key a script touches is in its KEYS, so the runs are read before). A lease that
        # left the states meanwhile is not answered; of several batches, the earliest clock is.
        states = [state for state in dict.fromkeys(op.states) if state in _LIVE]
        pipe = self._client.pipeline(transaction=True)
        for state in states:
            pipe.zrange(self.keys.leases(state), 0, -1)  # pyright: ignore[reportUnknownMemberType]
        replies = cast(list[list[bytes]], await pipe.execute()) if states else []
        run_ids = list(dict.fromkeys(run_id.decode() for found in replies for run_id in found))
        rows: list[ops.LeaseRow] = []
        clocks: list[int] = []
        for first in range(0, max(len(run_ids), 1), _LEASE_BATCH):
            batch = run_ids[first : first + _LEASE_BATCH]
            now, *flat = await self._script(self._list_leases, [self.keys.run(r).lease for r in batch], states)
            clocks.append(int(now))
            step = 1 + len(LEASE_FIELDS)
            for i in range(0, len(flat), step):
                rows.append(_lease_row(batch[int(flat[i]) - 1], flat[i + 1 : i + step]))
        return rows, min(clocks) / _US

    async def get_lease_start(self, tx: Any, op: ops.GetLeaseStart) -> bytes | None:
        return cast(bytes | None, await self._client.get(self.keys.run(op.run_id).leasestart))

    async def check_lease(self, tx: _Batch, op: ops.CheckLease) -> None:
        # checked by COMMIT before its first write, which answers `fenced:<run>` when it fails
        tx.args += ['L', tx.run(op.run_id), op.epoch]


class RedisStepStore(ClientUser, EngineStore):
    """Step persistence in Redis through redis-py's asyncio client.

    Pass a Redis URL as `url=` (the store opens its own client and closes it in `aclose()`) or a
    shared `redis.asyncio.Redis` as `client=` (never closed by the store; it must answer bytes,
    i.e. be built without `decode_responses=True`). Every key starts with `key_prefix:`, so
    several applications can share one server.

    Every write is one Lua script: a batch's snapshot, ledger entries and events are stored
    together or not at all. How durable a returned write is depends on the server's persistence
    settings: see the documentation (`appendonly yes` with `appendfsync always` makes it durable
    before the call returns).

    Binary content and strings of `media_threshold_bytes` or more go to `media_store`: with
    `'auto'` (the default) a `RedisMediaStore` on the same client and prefix; `None` keeps them
    inline; or pass a media store of your own.
    `max_snapshots_per_run` bounds the snapshots kept per run.
    """

    features: ClassVar[frozenset[str]] = frozenset(
        {SNAPSHOT_RETENTION, MEDIA_EXTERNALIZATION, PERSISTENT, ENCRYPTION, CHECKSUMS, LEASES}
    )

    def __init__(
        self,
        *,
        url: str | None = None,
        client: Redis | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        media_store: MediaStoreOption = 'auto',
        media_threshold_bytes: int = DEFAULT_MEDIA_THRESHOLD_BYTES,
        max_snapshots_per_run: int | None = None,
        encryption: Encryption | None = None,
    ) -> None:
        # options are checked before a client is created, so a bad one leaves nothing to close
        keys = Keys(key_prefix)
        self.check_options(
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            media_threshold_bytes=media_threshold_bytes,
        )
        ClientUser.__init__(self, 'RedisStepStore', client, url)
        self.key_prefix = key_prefix
        EngineStore.__init__(
            self,
            RedisPort(self.client, keys),
            max_snapshots_per_run=max_snapshots_per_run,
            media_store=media_store,
            default_media_store=lambda: RedisMediaStore(client=self.client, key_prefix=key_prefix),
            media_threshold_bytes=media_threshold_bytes,
            encryption=encryption,
        )

    @property
    def keys(self) -> Keys:
        """The names of the keys this store uses (see `step_redis.keys`)."""
        port = self.port
        assert isinstance(port, RedisPort)
        return port.keys

    async def aclose(self) -> None:
        """Close the client if this store created it from `url`; a given client stays open."""
        await ClientUser.aclose(self)
