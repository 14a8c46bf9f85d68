"""Settling by hand: a person checked a call a crash cut short, outside the agent, and says how it went.

`resolve_run` leaves a call whose tool has no other recovery policy (`'ask'`, the default) to a
person: `supply_result` (it happened, and this is its result), `mark_checked` (it happened: the model
gets a note) or `rerun_call` (it did not: it runs again). Each records the answer in the run's ledger
under recovery's claim, and the next `resolve_run` hands it to the resumed run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepcore.ownership.claims import Claim
from stepcore.recovery.chains import continuations
from stepcore.recovery.claiming import claim_for_recovery, fenced, release_quietly
from stepcore.recovery.cut import cut_view
from stepcore.recovery.ledger import SettledBy, record_settlements
from stepcore.store.contract import as_step_store
from stepcore.store.leases import DEFAULT_LEASE_TTL, LeaseState
from stepcore.store.models import ToolEffectRecord
from stepcore.store.protocols import StepStoreProtocol
from stepcore.store.step_store import StepStore

__all__ = ('CHECKED_NOTE', 'mark_checked', 'rerun_call', 'supply_result')

CHECKED_NOTE = 'Checked after a crash: the effect of this call is in place.'
"""What the model receives for a call marked checked without a note of its own."""


async def _settle_by_hand(
    store: StepStoreProtocol,
    run_id: str,
    tool_call_id: str,
    how: SettledBy,
    result: Any,
    *,
    force: bool,
    lease_ttl: float,
) -> ToolEffectRecord:
    bound = as_step_store(store)
    followed = await continuations(bound, run_id)
    target = followed[-1]
    action = {'supplied': 'supply_result', 'checked': 'mark_checked'}.get(how, 'rerun_call')
    # checked before the claim, so a refused settlement changes nothing (the lease's epoch included),
    # and again under it, in case the run moved on meanwhile
    await _hand_entry(bound, run_id, target, tool_call_id, force=force, action=action)
    claim, _ = await claim_for_recovery(bound, target, force=force, ttl=lease_ttl, action=action)
    try:
        entry = await _hand_entry(bound, run_id, target, tool_call_id, force=force, action=action)
        with fenced(claim):
            await record_settlements(bound, [(entry, how, result)], by_hand=True)
    except BaseException:
        await release_quietly(claim)
        raise
    if claim is not None:
        await _let_go(bound, claim, target)
    found = await bound.get_tool_effect(run_id=entry.run_id, tool_call_id=tool_call_id)
    assert found is not None
    return found


async def _hand_entry(
    store: StepStore, asked: str, target: str, tool_call_id: str, *, force: bool, action: str
) -> ToolEffectRecord:
    """The entry of `tool_call_id` a person may settle: an unsettled call of the cut cycle of a run that
    can be resumed (anything else is refused with a clear error unless `force`)."""
    where = f'run {target!r}' + (f' (the newest continuation of {asked!r})' if target != asked else '')
    try:
        view = await cut_view(store, target)
    except LookupError as error:
        if not force:
            raise LookupError(
                f'{action} refused: {error}. Pass force=True (--force) to settle the call anyway'
            ) from None
        view = None
    if view is not None and view.paused is not None and (deferred := view.paused.call(tool_call_id)) is not None:
        ran = [e for e in view.cycle.get(tool_call_id, ()) if e.run_id != view.paused.run_id]
        if not ran:
            raise ValueError(
                f'{action} refused: tool call {tool_call_id!r} ({deferred.tool_name}) of {where} is a deferred '
                f'call that waits for an answer ({deferred.kind}), not a call a crash cut short: answer it with '
                'approve_call, deny_call, answer_call or fail_call (stepcore answer)'
            )
    if view is not None and tool_call_id in view.cycle:
        entry = view.cycle[tool_call_id][0]
        recorded = view.recorded(tool_call_id)
        if not force and view.finished:
            raise ValueError(f'{action} refused: {where} already finished, so nothing will take this answer')
        if not force and recorded is not None and (recorded.how in ('supplied', 'checked') or recorded.by_hand):
            raise ValueError(
                f'{action} refused: tool call {tool_call_id!r} of {where} was already settled by hand '
                f'({recorded.how}); pass force=True (--force) to replace that answer'
            )
        return entry
    if not force:
        cut = ', '.join(view.cycle) if view is not None and view.cycle else 'none'
        chain = view.chain if view is not None else [target]
        found = await _find_entry(store, [*chain, asked], tool_call_id)
        if found is None:
            also = f' (nor do the runs it resumes: {", ".join(chain[1:])})' if len(chain) > 1 else ''
            raise LookupError(
                f'{action} refused: {where} has no ledger entry for tool call {tool_call_id!r}{also}: list them '
                f'with `stepcore effects {target}`'
            )
        state = 'completed normally' if found.status.value == 'completed' else f'is {found.status.value}'
        raise ValueError(
            f'{action} refused: tool call {tool_call_id!r} of {where} {state} and is not one the crash cut '
            f'short (calls to settle: {cut}); pass force=True (--force) to settle it anyway'
        )
    found = await _find_entry(store, [target, asked, *(view.chain if view is not None else ())], tool_call_id)
    if found is None:
        raise LookupError(f'run {target!r} has no ledger entry for tool call {tool_call_id!r}')
    return found


async def _find_entry(store: StepStore, runs: Sequence[str], tool_call_id: str) -> ToolEffectRecord | None:
    for rid in dict.fromkeys(runs):
        entry = await store.get_tool_effect(run_id=rid, tool_call_id=tool_call_id)
        if entry is not None:
            return entry
    return None


async def _let_go(store: StepStore, claim: Claim, run_id: str) -> None:
    """After a hand settlement: a run that was pending stays `pending` while calls still wait for a
    person, and is claimable at once (an orphan the fleet resumes) once none does; a run that was an
    orphan, or had no lease, is claimable at once; any other (a failed run) is left as it was."""
    previous = claim.previous
    if previous is not None and previous.state not in (LeaseState.RUNNING, LeaseState.PENDING):
        await claim.restore()
        return
    try:
        view = await cut_view(store, run_id)
    except LookupError:
        await claim.release()
        return
    waiting: list[str] = []
    for call, entries in view.cycle.items():
        recorded = view.recorded(call)
        if entries[0].unresolved and (recorded is None or not recorded.by_hand):
            waiting.append(call)
    if waiting and previous is not None and previous.state is LeaseState.PENDING:
        await claim.release(state=LeaseState.PENDING, note=f'settle by hand: {", ".join(waiting)}')
    else:
        await claim.release()


async def supply_result(
    store: StepStoreProtocol,
    *,
    run_id: str,
    tool_call_id: str,
    result: Any,
    force: bool = False,
    lease_ttl: float = DEFAULT_LEASE_TTL,
) -> ToolEffectRecord:
    """Settle a call you checked by hand: its effect happened, and `result` is what the model gets.

    Only an unsettled call of the cut cycle of a run that can be resumed is accepted (of the run's
    newest continuation, when it was resumed), and, on a store that keeps leases, only while no live
    owner holds the run (the call claims it while it writes): anything else is refused with an error
    saying why, unless `force=True`. The entry becomes `completed` (settled `supplied`); `resolve_run`
    hands the result to the resumed run. `result` must be JSON-serializable.
    """
    return await _settle_by_hand(store, run_id, tool_call_id, 'supplied', result, force=force, lease_ttl=lease_ttl)


async def mark_checked(
    store: StepStoreProtocol,
    *,
    run_id: str,
    tool_call_id: str,
    note: str | None = None,
    force: bool = False,
    lease_ttl: float = DEFAULT_LEASE_TTL,
) -> ToolEffectRecord:
    """Settle a call you checked by hand without a result of its own: its effect is in place.

    The entry becomes `completed` (settled `checked`); on resume the model receives `note` (by default
    `CHECKED_NOTE`) as the call's result. Accepted and refused as `supply_result`.
    """
    result = CHECKED_NOTE if note is None else note
    return await _settle_by_hand(store, run_id, tool_call_id, 'checked', result, force=force, lease_ttl=lease_ttl)


async def rerun_call(
    store: StepStoreProtocol,
    *,
    run_id: str,
    tool_call_id: str,
    force: bool = False,
    lease_ttl: float = DEFAULT_LEASE_TTL,
) -> ToolEffectRecord:
    """Settle a call you checked by hand and found did NOT happen: it runs again when the run resumes.

    For one call what `policies={tool: 'rerun'}` does for a whole tool. Accepted and refused as
    `supply_result`.
    """
    return await _settle_by_hand(store, run_id, tool_call_id, 'rerun', None, force=force, lease_ttl=lease_ttl)
