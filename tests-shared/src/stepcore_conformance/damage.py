"""Damaged records: what cannot be read is reported, never hidden, and costs only what needs it.

The policy (`stepcore.common.damage`): reading a damaged record on its own raises
`DamagedRecordError` (a `ValueError`) naming the run and the record and saying whether it is
`unreadable` (its bytes cannot be had) or `unparsable` (they do not decode: the kit's damage); the
listings `list_runs`, `list_events` and `list_snapshots` skip it with one WARNING on the logger
`stepcore.engine` saying the same; the
ledger is never skipped (a damaged entry raises, since leaving it out could hide an effect in
flight); every record that is not damaged still reads.

The section needs the backend's `damage` fixture (see `StoreFixtures.damage`), which overwrites
one stored body in the backend's own storage. Without it the section fails for a store declaring
`persistent` (its data outlives the process, so it can be damaged) and is skipped for others.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from pydantic_ai.messages import ModelMessage

from stepcore import (
    DamagedRecordError,
    EventKind,
    SnapshotState,
    StepStore,
    ToolEffectStatus,
    continue_run,
    inspect_recovery,
)

from ._declared import Hook, require_hook
from ._support import Damage, StoreFixtures, conversation, event, new_id, register, snapshot, tool_exchange
from .effects import effect

__all__ = ('REPLACEMENT', 'DamageConformance')

REPLACEMENT = b'{"format":1,"kind":17,"metadata":17}'
"""Valid JSON that is no valid record of any kind (a bad `kind`, a `metadata` that is not a mapping)."""

LOGGER = 'stepcore.engine'


DAMAGE_HOOK = Hook(
    fixture='damage',
    does='overwrites one stored record',
    see='StoreFixtures.damage in the stepcore-conformance README',
    needs='the damage section needs one to damage a stored record',
)


def _hook(damage: Damage | None, store: StepStore, owner: object) -> Damage:
    return require_hook(damage, store, owner, DAMAGE_HOOK)


@dataclass
class _Runs:
    """Two runs of one conversation: `target` (to damage) and `other` (never touched)."""

    target: str
    other: str
    conversation_id: str
    marker: str
    snapshot_seqs: list[int]
    """The target's snapshots: complete, complete (holding `marker`), interrupted (after it)."""


async def _write(store: StepStore) -> _Runs:
    conversation_id = new_id('conv')
    target = await register(store, new_id('target'), conversation_id=conversation_id)
    other = await register(store, new_id('other'), conversation_id=conversation_id)
    marker = new_id('damage-marker')
    for run_id in (target, other):
        for n in range(3):
            await store.append_event(event(run_id, n, kind=EventKind.MODEL_REQUEST_STARTED))
        await store.record_tool_effect(effect(run_id, 'c1', ToolEffectStatus.COMPLETED, started=1))
        await store.record_tool_effect(effect(run_id, 'c2', ToolEffectStatus.STARTED, started=2))
        first = conversation(1, tag=run_id)
        second: list[ModelMessage] = [*first, *tool_exchange(7, content=f'{marker} in {run_id}')]
        await store.save_snapshot(snapshot(run_id, first, step_index=1))
        await store.save_snapshot(snapshot(run_id, second, step_index=2))
        await store.save_snapshot(
            snapshot(run_id, [*second, *tool_exchange(8)[:1]], step_index=3, state=SnapshotState.INTERRUPTED)
        )
    seqs = [s.seq for s in await store.list_snapshots(run_id=target, include_interrupted=True)]
    known = [s for s in seqs if s is not None]
    assert len(known) == 3, f'snapshots of {target!r} must carry their seq: {seqs}'
    return _Runs(target, other, conversation_id, f'{marker} in {target}', known)


@contextmanager
def _warnings(caplog: pytest.LogCaptureFixture) -> Iterator[list[logging.LogRecord]]:
    caplog.clear()
    found: list[logging.LogRecord] = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        yield found
    found.extend(r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING)


def _check_warned(found: list[logging.LogRecord], run_id: str, count: int, listing: str) -> None:
    assert len(found) == count, (
        f'{listing} skipped {count} damaged record(s) of {run_id!r} but logged {len(found)} warning(s) on {LOGGER!r} '
        f'(expected one per skipped record): {[r.getMessage() for r in found]}'
    )
    for record in found:
        assert run_id in record.getMessage(), f'the warning does not name run {run_id!r}: {record.getMessage()}'
        # The kit's damage is bytes that read but do not decode: unparsable, not unreadable.
        assert 'unparsable' in record.getMessage(), f'the warning does not say "unparsable": {record.getMessage()}'


def _check_error(error: DamagedRecordError, run_id: str, *names: str) -> None:
    assert error.run_id == run_id, f'DamagedRecordError.run_id is {error.run_id!r}, not {run_id!r}: {error}'
    assert error.kind == 'unparsable', f'DamagedRecordError.kind is {error.kind!r}, not unparsable: {error}'
    assert run_id in str(error), f'the error does not name run {run_id!r}: {error}'
    for name in names:
        found = re.search(rf'\b{re.escape(name)}\b', error.record) if name.isdigit() else name in error.record
        assert found, f'the error does not name {name!r} as the damaged record: {error.record!r}'


async def _other_run_reads(store: StepStore, runs: _Runs) -> None:
    """The run that was not damaged reads whole."""
    assert await store.get_run(run_id=runs.other) is not None
    assert len(await store.list_events(run_id=runs.other)) == 3
    assert [e.tool_call_id for e in await store.list_tool_effects(run_id=runs.other)] == ['c1', 'c2']
    assert [s.step_index for s in await store.list_snapshots(run_id=runs.other, include_interrupted=True)] == [1, 2, 3]
    latest = await store.latest_snapshot(run_id=runs.other)
    assert latest is not None
    assert latest.step_index == 2


class DamageConformance(StoreFixtures):
    """A damaged run record, event, ledger entry, snapshot header or message, through every read."""

    async def test_damaged_run_record(
        self, store: StepStore, damage: Damage | None, caplog: pytest.LogCaptureFixture
    ) -> None:
        hook = _hook(damage, store, self)
        runs = await _write(store)
        await hook(store, 'run', runs.target, None, REPLACEMENT)
        with _warnings(caplog) as found:
            listed = [r.run_id for r in await store.list_runs(conversation_id=runs.conversation_id)]
        assert listed == [runs.other], f'list_runs must skip only the damaged run: {listed}'
        _check_warned(found, runs.target, 1, 'list_runs')
        assert runs.other in [r.run_id for r in await store.list_runs()]
        with pytest.raises(DamagedRecordError) as raised:
            await store.get_run(run_id=runs.target)
        _check_error(raised.value, runs.target, 'run')
        # The run's other records do not need its record.
        assert len(await store.list_events(run_id=runs.target)) == 3
        assert len(await store.list_snapshots(run_id=runs.target, include_interrupted=True)) == 3
        await _other_run_reads(store, runs)

    async def test_damaged_event(
        self, store: StepStore, damage: Damage | None, caplog: pytest.LogCaptureFixture
    ) -> None:
        hook = _hook(damage, store, self)
        runs = await _write(store)
        seqs = [e.seq for e in await store.list_events(run_id=runs.target)]
        await hook(store, 'event', runs.target, seqs[1], REPLACEMENT)
        with _warnings(caplog) as found:
            listed = [e.seq for e in await store.list_events(run_id=runs.target)]
        assert listed == [seqs[0], seqs[2]], f'list_events must skip only the damaged event (seq {seqs[1]}): {listed}'
        _check_warned(found, runs.target, 1, 'list_events')
        await _other_run_reads(store, runs)

    async def test_damaged_ledger_entry(self, store: StepStore, damage: Damage | None) -> None:
        hook = _hook(damage, store, self)
        runs = await _write(store)
        await hook(store, 'effect', runs.target, 'c2', REPLACEMENT)  # the started one: unresolved listings need it
        with pytest.raises(DamagedRecordError) as raised:
            await store.list_tool_effects(run_id=runs.target)
        _check_error(raised.value, runs.target, 'c2')
        with pytest.raises(DamagedRecordError) as raised:
            await store.list_unresolved_tool_effects(run_id=runs.target)
        _check_error(raised.value, runs.target, 'c2')
        with pytest.raises(DamagedRecordError):
            await inspect_recovery(store=store, run_id=runs.target)
        entry = await store.get_tool_effect(run_id=runs.target, tool_call_id='c1')
        assert entry is not None, 'the entry that was not damaged must still read'
        assert entry.status is ToolEffectStatus.COMPLETED
        await _other_run_reads(store, runs)

    async def test_damaged_snapshot_header(
        self, store: StepStore, damage: Damage | None, caplog: pytest.LogCaptureFixture
    ) -> None:
        hook = _hook(damage, store, self)
        runs = await _write(store)
        first, second, third = runs.snapshot_seqs
        await hook(store, 'snapshot', runs.target, second, REPLACEMENT)
        await self._latest_complete_is_damaged(store, runs.target, second)
        newest = await store.latest_snapshot(run_id=runs.target, include_interrupted=True)
        assert newest is not None, 'the interrupted snapshot after the damaged one must still read'
        assert newest.seq == third
        with _warnings(caplog) as found:
            listed = [s.seq for s in await store.list_snapshots(run_id=runs.target, include_interrupted=True)]
        assert listed == [first, third], f'list_snapshots must skip only the damaged snapshot (seq {second}): {listed}'
        _check_warned(found, runs.target, 1, 'list_snapshots')
        with _warnings(caplog) as found:
            listed = [s.seq for s in await store.list_snapshots(run_id=runs.target)]
        assert listed == [first], f'list_snapshots must skip the damaged snapshot (seq {second}): {listed}'
        _check_warned(found, runs.target, 1, 'list_snapshots')
        await _other_run_reads(store, runs)

    async def test_damaged_message(
        self, store: StepStore, damage: Damage | None, caplog: pytest.LogCaptureFixture
    ) -> None:
        hook = _hook(damage, store, self)
        runs = await _write(store)
        first, second, third = runs.snapshot_seqs
        await hook(store, 'message', runs.target, runs.marker, REPLACEMENT)
        await self._latest_complete_is_damaged(store, runs.target, second)
        with pytest.raises(DamagedRecordError) as raised:
            await store.latest_snapshot(run_id=runs.target, include_interrupted=True)
        _check_error(raised.value, runs.target, 'snapshot', str(third))
        with _warnings(caplog) as found:
            listed = [s.seq for s in await store.list_snapshots(run_id=runs.target, include_interrupted=True)]
        # Both later snapshots hold the damaged message; the first does not.
        assert listed == [first], f'list_snapshots must skip the snapshots holding the damaged message: {listed}'
        _check_warned(found, runs.target, 2, 'list_snapshots')
        await _other_run_reads(store, runs)

    async def _latest_complete_is_damaged(self, store: StepStore, run_id: str, seq: int) -> None:
        with pytest.raises(DamagedRecordError) as raised:
            await store.latest_snapshot(run_id=run_id)
        _check_error(raised.value, run_id, 'snapshot', str(seq))
        try:
            await continue_run(store, run_id=run_id)
        except LookupError as error:
            pytest.fail(f'continue_run answered LookupError for a damaged snapshot, as if there were none: {error}')
        except DamagedRecordError as error:
            _check_error(error, run_id, 'snapshot', str(seq))
        else:
            pytest.fail(f'continue_run read run {run_id!r} although its latest complete snapshot is damaged')
