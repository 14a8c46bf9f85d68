"""Bit flips: read everything a store holds and tell whether a damaged copy ever answers differently.

A backend's test builds a small store with a real agent run, then, for a sample of byte positions
in its files, flips one bit in a copy, opens the copy and reads everything through the public API
(`read_everything`). `judge` compares what came back with the undamaged reading: every answer must
be equal to the original, or be missing with a warning logged, or be an error. An answer that
differs, or an item left out without a warning, is *silent* damage, which the checksums of
`stepcore.engine._seal` exist to prevent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from stepcore import DamagedRecordError, StepStore
from stepcore.backend import warnings_logged

__all__ = ('Outcome', 'Reading', 'flip_bit', 'judge', 'positions', 'read_everything', 'warnings_logged')

Outcome = Literal['same', 'detected', 'lost', 'stale', 'silent']


@dataclass
class Reading:
    """What each read of a store answered (`error` for a read that raised)."""

    answers: dict[str, Any] = field(default_factory=dict[str, Any])
    errors: dict[str, str] = field(default_factory=dict[str, str])
    unnamed: dict[str, str] = field(default_factory=dict[str, str])
    """The errors of reads of one run that are not a `DamagedRecordError` naming that run (an error the
    whole store answered, `list_runs` included, is not one of them)."""


_READS: tuple[str, ...] = (
    'get_run',
    'list_events',
    'list_tool_effects',
    'list_unresolved_tool_effects',
    'list_snapshots',
    'latest_snapshot',
)


async def read_everything(store: StepStore, run_ids: list[str]) -> Reading:
    """`list_runs()` and, for each of `run_ids`, every read of the run (interrupted snapshots included)."""
    reading = Reading()

    async def one(name: str, call: Callable[[], Awaitable[Any]], run_id: str | None = None) -> None:
        try:
            reading.answers[name] = await call()
        except Exception as error:  # any error is a detection: the read did not return wrong data
            reading.errors[name] = f'{type(error).__name__}: {error}'
            named = isinstance(error, DamagedRecordError) and error.run_id == run_id
            # the store refused as a whole (`list_runs` failed the same way): no run to name
            whole = reading.errors[name] == reading.errors.get('list_runs')
            if run_id is not None and not named and not whole:
                reading.unnamed[name] = reading.errors[name]

    await one('list_runs', store.list_runs)
    for run_id in run_ids:
        for read in _READS:
            method = getattr(store, read)
            if read in ('list_snapshots', 'latest_snapshot'):
                await one(f'{read}:{run_id}', lambda m=method, r=run_id: m(r, include_interrupted=True), run_id)
            else:
                await one(f'{read}:{run_id}', lambda m=method, r=run_id: m(r), run_id)
    return reading


def _items(answer: Any) -> list[Any]:
    if answer is None:
        return []
    return list(cast(list[Any], answer)) if isinstance(answer, list) else [answer]


def judge(original: Reading, damaged: Reading, warned: bool) -> tuple[Outcome, str]:
    """How a damaged store's reading compares with the original one:

    - `same`: every read answered what the original did;
    - `detected`: some read raised, or left records out with a warning, and all others were the same;
    - `lost`: a read left records out without a warning (the backend's own index no longer finds
      them: the records that came back are intact, but fewer);
    - `stale`: `latest_snapshot` returned an older snapshot of the run, intact, without a warning
      (a flipped `seq`, which a backend assigns and no checksum covers, made it look newest);
    - `silent`: a read returned a record that differs from every stored one.
    """
    outcome: Outcome = 'detected' if damaged.errors or warned else 'same'
    what = ''
    for name, answer in damaged.answers.items():
        before = _items(original.answers.get(name))
        after = _items(answer)
        for item in after:
            if any(item == b for b in before):
                continue
            if name.startswith('latest_snapshot:'):
                older = _items(original.answers.get('list_snapshots:' + name.partition(':')[2]))
                if any(item == b for b in older):
                    # an older stored snapshot, intact: with a warning, the newest was reported
                    # (the answer a crash would give); without one, a flipped seq made it look newest
                    if warned:
                        outcome = 'detected'
                    else:
                        outcome, what = 'stale', f'{name} returned an older intact snapshot (seq {item.seq})'
                    continue
            return 'silent', f'{name} returned a record that differs from the stored one: {item!r:.2000}'
        if len(after) < len(before) and not warned:
            outcome, what = 'lost', f'{name} left {len(before) - len(after)} record(s) out without a warning'
    return outcome, what


def flip_bit(data: bytes, position: int, bit: int) -> bytes:
    """`data` with bit `bit` (0-7) of the byte at `position` flipped."""
    flipped = bytearray(data)
    flipped[position] ^= 1 << (bit % 8)
    return bytes(flipped)


def positions(size: int, limit: int) -> range:
    """Every byte position of `size` bytes, or an even spread of about `limit` of them."""
    step = max(1, -(-size // limit))
    return range(0, size, step)
