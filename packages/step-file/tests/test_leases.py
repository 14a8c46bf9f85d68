"""Leases in a file store: the lease file, its start point and the index of states, kept under the run's lock.

The kit's leases section checks the behaviour; these check the files: where they go (a lease may
come before its run folder does), that the index follows the lease file, and what a swap stopped
between its writes, a stale marker or a damaged lease file leave.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart

from step_file import FileStepStore
from step_file.layout import LEASE_FILE, LEASE_INDEX_DIR, LEASE_START_FILE
from stepcore import EventKind, RunRecord, StepEvent
from stepcore.engine import DamagedRecordError
from stepcore.engine.faults import InjectedFault, boundaries, inject_faults, stop_at
from stepcore.ownership import open_lease
from stepcore.ownership.claims import lease_template
from stepcore.store.ids import validate_path_safe_run_id
from stepcore.store.leases import Fence, Lease, LeaseState, Owner, fencing

START: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart('go')])]
STRANGER = Owner(host='another-host.invalid', pid=4242, token='t-stranger')


def markers(root: Path) -> set[str]:
    """`<state>/<run id>` of every marker in the index."""
    index = root / LEASE_INDEX_DIR
    return {str(p.relative_to(index)) for p in index.rglob('*') if p.is_file()} if index.exists() else set()


async def listed(store: FileStepStore, *states: LeaseState) -> dict[str, str]:
    return {lease.run_id: lease.state.value for lease in await store.list_leases(states)}


async def swap_to(store: FileStepStore, lease: Lease, state: LeaseState, *, epoch: int | None = None) -> Lease:
    new = replace(
        lease, state=state, epoch=epoch or lease.epoch, owner=None if state is LeaseState.ENDED else lease.owner
    )
    swapped, now = await store.swap_lease(new, expect=lease.epoch, ttl=60.0)
    assert swapped
    assert now is not None
    return now


@pytest.fixture
def no_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def test_no_run_id_can_name_the_index() -> None:
    with pytest.raises(ValueError, match='not path-safe'):
        validate_path_safe_run_id(LEASE_INDEX_DIR)


async def test_a_lease_taken_before_its_run_registers_makes_no_run(tmp_path: Path, no_umask: None) -> None:
    store = FileStepStore(tmp_path / 'runs')
    await open_lease(store, 'early', ttl=60.0, start=START)
    root = tmp_path / 'runs'
    assert sorted(p.name for p in (root / 'early').iterdir()) == ['.lock', LEASE_START_FILE, LEASE_FILE, 'snapshots']
    assert markers(root) == {'running/early'}
    # neither the lease-only folder nor the index is a run; maintenance still sees it (its start point may hold media)
    assert await store.list_runs() == []
    assert await store.stored_run_ids() == ['early']
    assert await listed(store, LeaseState.RUNNING) == {'early': 'running'}
    assert await store.lease_start('early') == START
    created = [root, *root.rglob('*')]
    modes = {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in created}
    assert modes == {name: 0o700 if (root / name).is_dir() else 0o600 for name in modes}

    await store.register_run(RunRecord(run_id='early'))
    assert [r.run_id for r in await store.list_runs()] == ['early']
    assert await store.stored_run_ids() == ['early']
    await store.aclose()


async def test_the_index_follows_the_lease_state(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    lease = await open_lease(store, 'moving', ttl=60.0)
    lease = await swap_to(store, lease, LeaseState.RUNNING)  # a renewal: the marker stays
    assert markers(tmp_path) == {'running/moving'}
    lease = await swap_to(store, lease, LeaseState.WAITING, epoch=2)
    assert markers(tmp_path) == {'waiting/moving'}
    assert await listed(store, LeaseState.RUNNING, LeaseState.WAITING) == {'moving': 'waiting'}
    await swap_to(store, lease, LeaseState.ENDED)
    assert markers(tmp_path) == set(), 'an ended lease is in no folder of the index'
    assert await listed(store, LeaseState.RUNNING, LeaseState.WAITING, LeaseState.PENDING) == {}
    ended = await store.get_lease('moving')
    assert ended is not None
    assert (ended.state, ended.epoch) == (LeaseState.ENDED, 2)
    await store.aclose()


FIRST_SWAP = ['swap_lease', 'swap_lease:start', 'swap_lease:index', 'swap_lease:lease', 'commit', 'committed']


async def test_a_first_swap_passes_the_file_ports_own_boundaries(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    assert await boundaries(store, lambda: open_lease(store, 'r', ttl=60.0, start=START)) == FIRST_SWAP
    await store.aclose()


@pytest.mark.parametrize('index', range(len(FIRST_SWAP)))
async def test_a_first_swap_stopped_at_any_boundary(tmp_path: Path, index: int) -> None:
    store = FileStepStore(tmp_path)
    with inject_faults(store, stop_at(index)), pytest.raises(InjectedFault):
        await open_lease(store, 'r', ttl=60.0, start=START)
    await store.aclose()

    fresh = FileStepStore(tmp_path)
    lease = await fresh.get_lease('r')
    if lease is None:  # stopped before the lease file: no lease, no start point, in no listing
        assert await fresh.lease_start('r') is None
        assert await listed(fresh, LeaseState.RUNNING) == {}
        lease = await open_lease(fresh, 'r', ttl=60.0, start=START)  # the retry takes it
    assert lease.epoch == 1
    assert await fresh.lease_start('r') == START
    assert await listed(fresh, LeaseState.RUNNING) == {'r': 'running'}
    assert markers(tmp_path) == {'running/r'}
    assert [p.name for p in tmp_path.rglob('*.tmp')] == []
    await fresh.aclose()


@pytest.mark.parametrize('index', range(5))
async def test_a_takeover_stopped_at_any_boundary(tmp_path: Path, index: int) -> None:
    """running at epoch 1, then waiting at epoch 2: stopped anywhere, the lease is the old one or the
    new one, and the listings agree with it."""
    store = FileStepStore(tmp_path)
    first = await open_lease(store, 'r', ttl=60.0, owner=STRANGER)
    new = replace(first, epoch=2, state=LeaseState.WAITING)
    with inject_faults(store, stop_at(index)), pytest.raises(InjectedFault):
        await store.swap_lease(new, expect=1, ttl=60.0)
    await store.aclose()

    fresh = FileStepStore(tmp_path)
    lease = await fresh.get_lease('r')
    assert lease is not None
    assert (lease.epoch, lease.state) in ((1, LeaseState.RUNNING), (2, LeaseState.WAITING))
    everything = await listed(fresh, LeaseState.RUNNING, LeaseState.WAITING, LeaseState.PENDING)
    assert everything == {'r': lease.state.value}
    assert await listed(fresh, LeaseState.WAITING if lease.epoch == 1 else LeaseState.RUNNING) == {}
    if lease.epoch == 1:
        swapped, _ = await fresh.swap_lease(new, expect=1, ttl=60.0)
        assert swapped
    renewed, _ = await fresh.swap_lease(new, expect=2, ttl=60.0)
    assert renewed
    assert markers(tmp_path) == {'waiting/r'}, 'the next swap removes a marker a stopped one left'
    await fresh.aclose()


async def test_stale_markers_are_passed_over_and_removed(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    lease = await open_lease(store, 'moved', ttl=60.0)
    lease = await swap_to(store, lease, LeaseState.WAITING)
    for stale in ('running/moved', 'running/ghost', 'pending/not.a..run'):
        (tmp_path / LEASE_INDEX_DIR / stale).parent.mkdir(exist_ok=True)
        (tmp_path / LEASE_INDEX_DIR / stale).touch()
    assert await listed(store, LeaseState.RUNNING, LeaseState.PENDING) == {}
    assert await listed(store, LeaseState.RUNNING, LeaseState.WAITING) == {'moved': 'waiting'}
    await swap_to(store, lease, LeaseState.WAITING)
    assert 'running/moved' not in markers(tmp_path)
    assert await store.delete_run('ghost') is False
    assert markers(tmp_path) == {'waiting/moved', 'pending/not.a..run'}
    await store.aclose()


async def test_deleting_a_run_takes_its_lease_and_markers(tmp_path: Path) -> None:
    store = FileStepStore(tmp_path)
    await open_lease(store, 'leased-only', ttl=60.0, start=START)
    assert await store.delete_run('leased-only') is True, 'a lease is something stored'
    assert markers(tmp_path) == set()
    assert sorted(p.name for p in tmp_path.iterdir()) == [LEASE_INDEX_DIR]
    assert await store.get_lease('leased-only') is None
    assert await store.lease_start('leased-only') is None
    await open_lease(store, 'leased-only', ttl=60.0)  # taken afresh, at epoch 1
    await store.aclose()


async def test_a_damaged_lease_file_is_reported_and_never_overwritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStepStore(tmp_path)
    await open_lease(store, 'ok', ttl=60.0)
    await open_lease(store, 'broken', ttl=0.0, owner=STRANGER)
    path = tmp_path / 'broken' / LEASE_FILE
    path.write_bytes(b'{"format":2,"epoch":"one"')
    with pytest.raises(DamagedRecordError, match=r"lease of run 'broken' .* is unparsable") as caught:
        await store.get_lease('broken')
    assert caught.value.run_id == 'broken'
    with caplog.at_level(logging.WARNING):
        assert await listed(store, LeaseState.RUNNING) == {'ok': 'running'}
    assert any("lease of run 'broken'" in r.getMessage() for r in caplog.records)
    taken = lease_template('broken', epoch=2, state=LeaseState.RUNNING, owner=STRANGER, origin='broken')
    with pytest.raises(DamagedRecordError):
        await store.swap_lease(taken, expect=1, expired=True, ttl=60.0)
    with fencing(Fence('broken', 1)), pytest.raises(DamagedRecordError):
        await store.append_event(StepEvent(run_id='broken', kind=EventKind.RUN_STARTED, step_index=0))
    assert path.read_bytes() == b'{"format":2,"epoch":"one"'
    assert await store.list_events('broken') == []
    await store.aclose()
