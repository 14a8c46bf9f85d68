"""A cancel that keeps losing its run to other claimers says so with the error every refusal uses."""

from __future__ import annotations

from typing import Any

import pytest

from stepcore import InMemoryStepStore, RunRecord, cancel_run
from stepcore.ownership import open_lease
from stepcore.recovery import cancel
from stepcore.store.leases import LeaseState, RunClaimedError


async def test_a_run_that_changes_hands_at_every_try_refuses_the_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    store = InMemoryStepStore()
    await store.register_run(RunRecord(run_id='busy'))
    await open_lease(store, 'busy', ttl=60.0)
    tries: list[str] = []

    async def taken_meanwhile(store: Any, run_id: str, **_: Any) -> Any:
        tries.append(run_id)
        raise RunClaimedError(run_id, await store.get_lease(run_id), action='claimed for cancelled')

    monkeypatch.setattr(cancel, 'claim_run', taken_meanwhile)
    with pytest.raises(RunClaimedError, match=r"run 'busy' cannot be cancelled: it changed hands 5 times") as refused:
        await cancel_run(store, run_id='busy', reason='stop it')
    assert len(tries) == 5
    assert refused.value.lease is not None
    assert refused.value.lease.state is LeaseState.RUNNING, 'nothing changed'
