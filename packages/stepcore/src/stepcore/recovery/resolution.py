"""`resolve_run`: settle the tool calls a crash cut short, by each tool's recovery policy, and resume.

After a kill the newest complete snapshot of a run ends before the tool cycle that was running:
the model's response with its calls reached no complete snapshot, and the ledger holds those calls
as `started` (or `failed`, for one whose retry prompt never reached a snapshot). Continuing from the
snapshot would ask the model again, and it would call the tools again. `resolve_run` instead:

1. takes the newest complete snapshot and the calls of the cut cycle (the ledger entries of the
   newest step that the snapshot does not hold);
2. settles each by its tool's policy (`stepcore.recovery.policies`): `'rerun'` runs it again, a reconcile
   function asks the outside world, `'ask'` leaves it to the caller, who settles it with
   `supply_result` or `mark_checked` (or `stepcore recover --supply/--mark-checked`);
3. records each settlement in the crashed run's ledger (`completed`, the effect summary saying how)
   with a `tool_call_completed` event whose metadata carries how and, for a result, the result;
4. returns a `Resumption`: the history (the snapshot plus the model's response, taken from an
   interrupted snapshot when `capture_frontier=True` saved it, else rebuilt from the ledger) and
   pydantic-ai `DeferredToolResults` (results for settled calls, approvals for calls to run), so
   the resumed run carries on without the model asking again.

`Resumption.run(agent)` runs it and tags the new run's record with the run it resumes
(`RESUMES_KEY`). A resumption killed before it saved a complete snapshot got no further than the
cut cycle: it ran some of its calls again (or, when the snapshot ended on a model request, made
that request and started the calls of its response). `resolve_run` on it follows the tags back to
the newest run with a complete snapshot and reads the ledgers of every run on the way, so a call an
abandoned resumption started is settled by its policy like any cut-short call, never run blindly.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, cast

import pydantic_core
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import DeferredToolResults

from stepcore.ownership.claims import Claim
from stepcore.recovery.history import unanswered_tool_calls
from stepcore.recovery.policies import Reconciled, RecoveryPolicy, policy_for, reconcile
from stepcore.store.contract import as_step_store, write_records
from stepcore.store.models import (
    ContinuableSnapshot,
    EventKind,
    SnapshotState,
    StepEvent,
    ToolEffectRecord,
    ToolEffectStatus,
    utcnow,
)
from stepcore.store.protocols import StepStore, StepStoreProtocol

__all__ = (
    'HOW_KEY',
    'RESULT_KEY',
    'RESUMES_KEY',
    'SUMMARY_MARK',
    'Resumption',
    'SettledBy',
    'Settlement',
    'called_in',
    'claim_resumption',
    'mark_checked',
    'resolve_run',
    'settlements_of',
    'supply_result',
    'take_resumption',
)

SettledBy: TypeAlias = Literal['rerun', 'reconciled', 'supplied', 'checked', 'snapshot']
"""How a call cut short was settled: run again, reconciled with the outside world, given a result by
the caller, marked checked by the caller, or found answered in the complete snapshot already."""

HOW_KEY = 'stepcore.settled_by'
"""Metadata key of a settlement event: how the call was settled (`SettledBy`)."""
RESULT_KEY = 'stepcore.result'
"""Metadata key of a settlement event: the result the call gets, as JSON."""
RESUMES_KEY = 'stepcore.resumes'
"""Run-record metadata key of a run started by `Resumption.run`: the run it resumes."""

CHECKED_NOTE = 'Checked after a crash: the effect of this call is in place.'
"""What the model receives for a call marked checked without a note of its own."""

SUMMARY_MARK = ' [settled on recovery: '
"""What an entry's effect summary says, followed by how and `]`, once `resolve_run` or a caller settled it."""


@dataclass(frozen=True)
class Settlement:
    """One call of the cut cycle and how it was settled."""

    tool_call_id: str
    tool_name: str
    args: Any
    how: SettledBy
    result: Any = None
    """The result the call gets (`None` for a call that runs again)."""


@dataclass(frozen=True)
class Resumption:
    """What resuming a run takes: the history, the results to hand pydantic-ai, and what is left to settle."""

    run_id: str
    """The run asked about: the run `run` resumes."""
    message_history: list[ModelMessage]
    deferred_tool_results: DeferredToolResults | None
    """Results and approvals for the calls of the cut cycle; `None` when the history has no open call."""
    settled: tuple[Settlement, ...] = ()
    """The calls settled, in the order the model made them."""
    pending: tuple[ToolEffectRecord, ...] = ()
    """Calls under `'ask'` nobody settled yet: `supply_result` or `mark_checked` them, then resolve again."""
    stale: tuple[ToolEffectRecord, ...] = ()
    """Unresolved entries of older steps, whose calls are in no history the run can continue from
    (the model moved on without their results): check them by hand; they do not hold the run back."""
    finished: bool = False
    """The run had already ended with a final response: there is nothing to resume."""
    snapshot_run_id: str = ''
    """The run whose complete snapshot the history starts from: `run_id` itself, or, when `run_id` is a
    resumption killed before it saved one, the newest run it (through its own resumptions) resumes that did."""

    @property
    def ready(self) -> bool:
        """Whether the run can be resumed now: every call of the cut cycle is settled."""
        return not self.pending and not self.finished

    async def run(self, agent: Agent[Any, Any], **run_options: Any) -> AgentRunResult[Any]:
        """Resume: `agent.run(message_history=..., deferred_tool_results=..., **run_options)`.

        The new run's record carries `RESUMES_KEY` naming this run. Raises `RuntimeError` naming the
        calls still pending, or when the run had finished.
        """
        if self.finished:
            raise RuntimeError(f'run {self.run_id!r} already ended with a final response: there is nothing to resume')
        if self.pending:
            calls = ', '.join(f'{e.tool_name} ({e.tool_call_id}) args={e.args!r}' for e in self.pending)
            raise RuntimeError(
                f'run {self.run_id!r} has tool calls nobody settled yet: {calls}. Check each outside the agent, '
                'then supply_result(...) or mark_checked(...) it (stepcore recover --supply/--mark-checked) '
                'and call resolve_run again'
            )
        with _resuming(self.run_id):
            return await agent.run(
                message_history=self.message_history, deferred_tool_results=self.deferred_tool_results, **run_options
            )


# --- the link from a resumed run to the run it resumes -------------------------------------------


@dataclass
class _Link:
    run_id: str
    claim: Claim | None = None
    claimed: bool = False


_RESUMING: ContextVar[_Link | None] = ContextVar('stepcore_resuming', default=None)


@contextmanager
def _resuming(run_id: str, claim: Claim | None = None) -> Iterator[None]:
    token = _RESUMING.set(_Link(run_id, claim))
    try:
        yield
    finally:
        _RESUMING.reset(token)


def take_resumption() -> tuple[str, Claim | None] | None:
    """The run the starting run resumes, and recovery's claim on it, once: the first
    `StepPersistence` run to ask takes them (and hands the claimed run over to itself)."""
    link = _RESUMING.get()
    if link is None or link.claimed:
        return None
    link.claimed = True
    return link.run_id, link.claim


def claim_resumption() -> str | None:
    """The run the starting run resumes, once (see `take_resumption`)."""
    taken = take_resumption()
    return None if taken is None else taken[0]


# --- reading the ledger ----------------------------------------------------------------------------


def called_in(messages: Sequence[ModelMessage]) -> set[str]:
    """The ids of the tool calls the responses in `messages` made."""
    return {
        part.tool_call_id
        for message in messages
        if isinstance(message, ModelResponse)
        for part in message.parts
        if isinstance(part, ToolCallPart)
    }


def settlements_of(events: Sequence[StepEvent]) -> dict[str, tuple[SettledBy, Any]]:
    """The newest recorded settlement (how, result) of each call, from a run's events."""
    found: dict[str, tuple[SettledBy, Any]] = {}
    for event in events:
        how = event.metadata.get(HOW_KEY)
        if how is None or event.tool_call_id is None:
            continue
        raw = event.metadata.get(RESULT_KEY)
        found[event.tool_call_id] = (cast(SettledBy, how), None if raw is None else json.loads(raw))
    return found


async def _entries(store: StepStore, run_id: str, events: Sequence[StepEvent]) -> list[ToolEffectRecord]:
    """Every ledger entry of the run, oldest first, through the contract: the unresolved ones and
    those whose calls the events name."""
    unresolved = {e.tool_call_id: e for e in await store.list_unresolved_tool_effects(run_id=run_id)}
    entries = dict(unresolved)
    for event in events:
        call_id = event.tool_call_id
        if call_id is None or call_id in entries or event.kind is not EventKind.TOOL_CALL_STARTED:
            continue
        entry = await store.get_tool_effect(run_id=run_id, tool_call_id=call_id)
        if entry is not None:
            entries[call_id] = entry
    return sorted(entries.values(), key=lambda e: e.started_at)


def _summary(entry: ToolEffectRecord, how: SettledBy) -> str:
    base = entry.effect_summary or ''
    if SUMMARY_MARK in base:
        base = base[: base.index(SUMMARY_MARK)]
    return f'{base}{SUMMARY_MARK}{how}]'.lstrip()


async def _record(store: StepStore, entries: Sequence[tuple[ToolEffectRecord, SettledBy, Any]]) -> None:
    """Record settlements: each entry `completed` (its summary saying how) and an event carrying how and the result."""
    if not entries:
        return
    now = utcnow()
    writes: list[ToolEffectRecord | StepEvent] = []
    for entry, how, result in entries:
        metadata = {HOW_KEY: how}
        if how != 'rerun':
            metadata[RESULT_KEY] = pydantic_core.to_json(result).decode()
        writes.append(
            entry.model_copy(
                update={
                    'status': ToolEffectStatus.COMPLETED,
                    'error': None,
                    'ended_at': now,
                    'updated_at': now,
                    'effect_summary': _summary(entry, how),
                }
            )
        )
        writes.append(
            StepEvent(
                run_id=entry.run_id,
                kind=EventKind.TOOL_CALL_COMPLETED,
                step_index=entry.step_index,
                timestamp=now,
                tool_call_id=entry.tool_call_id,
                tool_name=entry.tool_name,
                metadata=metadata,
                idempotency_key=f'recovery:{entry.tool_call_id}:{uuid.uuid4().hex}',
            )
        )
    await write_records(store, writes)


@dataclass(frozen=True)
class _Ledger:
    """One run's ledger as resolving reads it."""

    run_id: str
    by_id: dict[str, ToolEffectRecord]
    """Its entries by call id, oldest first."""
    settlements: dict[str, tuple[SettledBy, Any]]


async def _ledger(store: StepStore, run_id: str) -> _Ledger:
    events = await store.list_events(run_id=run_id)
    entries = await _entries(store, run_id, events)
    return _Ledger(run_id, {e.tool_call_id: e for e in entries}, settlements_of(events))


async def _chain(store: StepStore, run_id: str) -> tuple[list[str], ContinuableSnapshot | None]:
    """`run_id` and the runs it resumes (`RESUMES_KEY`), newest first, back to the first that saved a
    complete snapshot; and that snapshot (`None` when none of them saved one)."""
    chain = [run_id]
    while (settled := await store.latest_snapshot(run_id=chain[-1])) is None:
        record = await store.get_run(run_id=chain[-1])
        origin = record.metadata.get(RESUMES_KEY) if record is not None else None
        if not isinstance(origin, str) or origin in chain:
            return chain, None
        chain.append(origin)
    return chain, settled


async def _entry(store: StepStore, run_id: str, tool_call_id: str) -> ToolEffectRecord:
    """The newest entry of the call: in `run_id`, else in the runs it resumes that saved no complete
    snapshot after it (where a resumption killed early leaves the calls it settled)."""
    chain, _ = await _chain(store, run_id)
    for rid in chain:
        entry = await store.get_tool_effect(run_id=rid, tool_call_id=tool_call_id)
        if entry is not None:
            return entry
    also = f' (nor do the runs it resumes: {", ".join(chain[1:])})' if len(chain) > 1 else ''
    raise LookupError(
        f'run {run_id!r} has no ledger entry for tool call {tool_call_id!r}{also}: '
        f'list them with `stepcore effects {run_id}`'
    )


async def supply_result(store: StepStoreProtocol, *, run_id: str, tool_call_id: str, result: Any) -> ToolEffectRecord:
    """Settle a call you checked by hand: its effect happened, and `result` is what the model gets.

    The entry becomes `completed` (settled `supplied`); `resolve_run` hands the result to the resumed
    run. `result` must be JSON-serializable. A resumption killed before it saved a complete snapshot
    may hold no entry of its own for the call: the entry of the run it resumes is settled then.
    Raises `LookupError` for an unknown call.
    """
    bound = as_step_store(store)
    entry = await _entry(bound, run_id, tool_call_id)
    await _record(bound, [(entry, 'supplied', result)])
    return await _entry(bound, entry.run_id, tool_call_id)


async def mark_checked(
    store: StepStoreProtocol, *, run_id: str, tool_call_id: str, note: str | None = None
) -> ToolEffectRecord:
    """Settle a call you checked by hand without a result of its own: its effect is in place.

    The entry becomes `completed` (settled `checked`); on resume the model receives `note` (by default
    `CHECKED_NOTE`) as the call's result. The entry is found as by `supply_result`. Raises
    `LookupError` for an unknown call.
    """
    bound = as_step_store(store)
    entry = await _entry(bound, run_id, tool_call_id)
    await _record(bound, [(entry, 'checked', CHECKED_NOTE if note is None else note)])
    return await _entry(bound, entry.run_id, tool_call_id)


# --- resolving ---------------------------------------------------------------------------------------


def _response_of(
    saved: Sequence[ContinuableSnapshot | None], base: Sequence[ModelMessage], cycle: Sequence[ToolEffectRecord]
) -> ModelResponse | None:
    """The model response of the cut cycle: as an interrupted snapshot of the chain saved it right after
    `base` (`capture_frontier=True`; then the crash may have come before any of its calls started), else
    rebuilt from the ledger (its calls, without text or thinking); `None` when there is neither."""
    wanted = {e.tool_call_id for e in cycle}
    for latest in saved:
        if (
            latest is not None
            and latest.state is SnapshotState.INTERRUPTED
            and len(latest.messages) == len(base) + 1
            and isinstance(last := latest.messages[-1], ModelResponse)
            and (calls := {c.tool_call_id for c in unanswered_tool_calls([last])})
            and wanted <= calls
        ):
            return last
    if not cycle:
        return None
    return ModelResponse(
        parts=[ToolCallPart(tool_name=e.tool_name, args=e.args, tool_call_id=e.tool_call_id) for e in cycle]
    )


def _cut_cycle(
    ledgers: Sequence[_Ledger], in_base: set[str]
) -> tuple[dict[str, list[ToolEffectRecord]], tuple[ToolEffectRecord, ...]]:
    """The calls of the cycle the crash cut short, each with its entries in the chain (newest first), and
    the stale entries.

    The cycle is the newest step of the snapshot's run outside its snapshot, plus the calls the
    abandoned resumptions started outside it (the same calls again, or, when the snapshot ended on a
    model request, the calls of the response a resumption got). Older unresolved entries of the
    snapshot's run are stale.
    """
    anchor = ledgers[-1]
    outside = [e for e in anchor.by_id.values() if e.tool_call_id not in in_base]
    step = max((e.step_index for e in outside), default=None)
    order = [e.tool_call_id for e in outside if e.step_index == step]
    stale = tuple(e for e in outside if e.step_index != step and e.unresolved)
    for ledger in reversed(ledgers[:-1]):  # oldest abandoned resumption first
        order += [call_id for call_id in ledger.by_id if call_id not in in_base and call_id not in order]
    cycle = {call_id: [ledger.by_id[call_id] for ledger in ledgers if call_id in ledger.by_id] for call_id in order}
    return cycle, stale


async def resolve_run(
    store: StepStoreProtocol,
    *,
    run_id: str,
    agent: Agent[Any, Any] | None = None,
    policies: Mapping[str, RecoveryPolicy] | None = None,
) -> Resumption:
    """Settle the calls a crash cut short in `run_id` by their tools' policies, and say how to resume.

    Policies come from `policies` (tool name to policy), then from the agent's tools
    (`recovery_policy`), else `'ask'`. Settlements are recorded in the run's ledger as they are
    made; calling it again settles nothing twice (a re-run call is re-run again, a reconciled call
    is asked about again, supplied and checked results are reused).

    A run started by `Resumption.run` that saved no complete snapshot is resolved from the run it
    resumes, together with the calls it started itself. Raises `LookupError` when there is nothing
    to resume from.
    """
    bound = as_step_store(store)
    chain, settled = await _chain(bound, run_id)
    if settled is None:
        also = f' (nor did the runs it resumes: {", ".join(chain[1:])})' if len(chain) > 1 else ''
        raise LookupError(
            f'run {run_id!r} has no complete snapshot to resume from{also}: it was stopped before its first '
            'settled step. Start it again (record the prompt with StepPersistence(capture_frontier=True) so a '
            'kill inside the first tool call leaves it resumable)'
        )
    ledgers = [await _ledger(bound, rid) for rid in chain]  # newest first; the snapshot's run last
    base = settled.messages
    in_base = called_in(base)

    # Calls whose results the snapshot already holds, left `started` by a store without batched writes.
    answered = [e for e in ledgers[-1].by_id.values() if e.unresolved and e.tool_call_id in in_base]
    await _record(bound, [(e, 'snapshot', None) for e in answered])

    cycle, stale = _cut_cycle(ledgers, in_base)
    saved = [await bound.latest_snapshot(run_id=rid, include_interrupted=True) for rid in chain]
    response = _response_of(saved, base, [entries[0] for entries in cycle.values()])
    if response is None:
        last = base[-1] if base else None
        finished = isinstance(last, ModelResponse) and not last.tool_calls
        return Resumption(
            run_id=run_id,
            message_history=list(base),
            deferred_tool_results=None,
            stale=stale,
            finished=finished,
            snapshot_run_id=chain[-1],
        )

    lookup = policy_for(agent, policies)
    results = DeferredToolResults()
    settlements: list[Settlement] = []
    newly: list[tuple[ToolEffectRecord, SettledBy, Any]] = []
    pending: list[ToolEffectRecord] = []
    for call in unanswered_tool_calls([response]):
        same_call = cycle.get(call.tool_call_id)
        if same_call is None:  # never started: nothing happened, it runs
            results.approvals[call.tool_call_id] = True
            continue
        entry = same_call[0]
        recorded = next(
            (led.settlements[call.tool_call_id] for led in ledgers if call.tool_call_id in led.settlements), None
        )
        how, result = await _settle(entry, recorded, lookup(entry.tool_name))
        if how is None:
            pending.append(entry)
            continue
        if how == 'rerun':
            results.approvals[entry.tool_call_id] = True
        else:
            results.calls[entry.tool_call_id] = result
        settlements.append(Settlement(entry.tool_call_id, entry.tool_name, entry.args, how, result))
        own = next(led for led in ledgers if led.run_id == entry.run_id).settlements.get(entry.tool_call_id)
        if own is None or own[0] != how or how == 'reconciled':
            newly.append((entry, how, result))
        # What older runs of the chain left unresolved for the same call is settled with it.
        for older in same_call[1:]:
            if older.unresolved:
                newly.append((older, how, result))
    await _record(bound, newly)
    return Resumption(
        run_id=run_id,
        message_history=[*base, response],
        deferred_tool_results=results,
        settled=tuple(settlements),
        pending=tuple(pending),
        stale=stale,
        snapshot_run_id=chain[-1],
    )


async def _settle(
    entry: ToolEffectRecord, recorded: tuple[SettledBy, Any] | None, policy: RecoveryPolicy
) -> tuple[SettledBy | None, Any]:
    """How `entry` is settled and with what result; `(None, None)` while nobody settled an `'ask'` call."""
    if recorded is not None and recorded[0] in ('supplied', 'checked'):
        return recorded
    if policy == 'rerun':
        return 'rerun', None
    if policy == 'ask':  # only the caller settles it: an earlier re-run or reconciliation is no answer now
        return None, None
    answer: Reconciled | None = await reconcile(policy, entry)
    if answer is None:
        return 'rerun', None
    return 'reconciled', answer.result
