"""What a crash left of a run, as recovery reads it: the history to start from and the calls it cut short.

After a kill the newest complete snapshot of a run ends before the tool cycle that was running.
`cut_view` reads, and writes nothing: the chain back to that snapshot (`stepcore.recovery.chains`),
the ledgers of its runs, the calls of the cut cycle (the ledger entries of the newest step the
snapshot does not hold), and the model response that made them. Resolving by policy
(`stepcore.recovery.resolution`) and settling by hand (`stepcore.recovery.by_hand`) both act on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart

from stepcore.capability.settled import unanswered_tool_calls
from stepcore.recovery.chains import back_to_snapshot
from stepcore.recovery.ledger import Ledger, Recorded, called_in, ledger_of
from stepcore.recovery.paused import Waiting
from stepcore.store.models import ContinuableSnapshot, SnapshotState, ToolEffectRecord
from stepcore.store.step_store import StepStore

__all__ = ('CutView', 'cut_view')


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
    ledgers: Sequence[Ledger], in_base: set[str]
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


@dataclass(frozen=True)
class CutView:
    """What a crash left of a run, as resolving reads it (nothing written)."""

    run_id: str
    chain: list[str]
    """`run_id` and the runs it resumes, newest first, back to the one its history starts from."""
    base: list[ModelMessage]
    """The history to start from: the newest complete snapshot of the chain (or the start point)."""
    from_start: bool
    ledgers: list[Ledger]
    """The ledgers of `chain`, in its order."""
    cycle: dict[str, list[ToolEffectRecord]]
    """The calls of the cut cycle, each with its entries in the chain (newest first)."""
    stale: tuple[ToolEffectRecord, ...]
    response: ModelResponse | None
    """The model response of the cut cycle, when there is one."""
    paused: Waiting | None = None
    """The pause `base` comes from, when the chain's oldest run paused on deferred tool calls."""

    @property
    def finished(self) -> bool:
        last = self.base[-1] if self.base else None
        return self.response is None and isinstance(last, ModelResponse) and not last.tool_calls

    def recorded(self, call_id: str) -> Recorded | None:
        """The newest settlement recorded for the call in any run of the chain."""
        return next((led.recorded[call_id] for led in self.ledgers if call_id in led.recorded), None)


async def cut_view(store: StepStore, run_id: str) -> CutView:
    """Read what a crash left of `run_id` (see `CutView`); `LookupError` when there is nothing to resume from."""
    chain = await back_to_snapshot(store, run_id)
    if chain.settled is None:
        also = f' (nor did the runs it resumes: {", ".join(chain.runs[1:])})' if len(chain.runs) > 1 else ''
        raise LookupError(
            f'run {run_id!r} has no complete snapshot to resume from{also}, and its store kept no start point for '
            'it: it was stopped before its first settled step. Start it again'
        )
    ledgers = [await ledger_of(store, rid) for rid in chain.runs]  # newest first; the snapshot's run last
    base = list(chain.settled.messages)
    in_base = answered_in(base, chain.paused)
    cycle, stale = _cut_cycle(ledgers, in_base)
    if chain.paused is not None:  # the deferred calls are open in the paused history itself
        return CutView(run_id, chain.runs, base, chain.from_start, ledgers, cycle, stale, None, chain.paused)
    saved = [await store.latest_snapshot(run_id=rid, include_interrupted=True) for rid in chain.runs]
    response = _response_of(saved, base, [entries[0] for entries in cycle.values()])
    return CutView(run_id, chain.runs, base, chain.from_start, ledgers, cycle, stale, response)


def answered_in(base: Sequence[ModelMessage], paused: Waiting | None) -> set[str]:
    """The calls `base` holds the results of: every call it made, but for a paused history's open calls."""
    made = called_in(base)
    if paused is None:
        return made
    return made - {call.tool_call_id for call in unanswered_tool_calls(base)}
