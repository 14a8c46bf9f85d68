"""What changed between two snapshots of a run, message by message."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

from stepcore.ui.conversation import MessageView, signature

__all__ = ('SnapshotDiff', 'diff_snapshots')


@dataclass(kw_only=True)
class SnapshotDiff:
    previous_seq: int | None
    kept: int = 0
    added: int = 0
    changed: int = 0
    removed: list[MessageView] = field(default_factory=list[MessageView])
    """Messages of the previous snapshot that this one no longer holds (a history rewrite)."""

    @property
    def summary(self) -> str:
        bits = [f'{self.kept} kept', f'{self.added} added']
        if self.changed:
            bits.append(f'{self.changed} changed')
        if self.removed:
            bits.append(f'{len(self.removed)} removed')
        return ', '.join(bits)


def diff_snapshots(
    previous: Sequence[MessageView], current: Sequence[MessageView], *, previous_seq: int, kept: int = 0
) -> SnapshotDiff:
    """Mark each message of `current` as added or changed against `previous`; list what was removed.

    Messages are matched by content (see `signature`). A replaced block counts its messages as
    changed, up to the shorter side; the rest are added or removed. `kept` counts messages before
    both lists that the caller already found unchanged (a shared prefix it left out).
    """
    diff = SnapshotDiff(previous_seq=previous_seq, kept=kept)
    matcher = SequenceMatcher(a=[signature(m) for m in previous], b=[signature(m) for m in current], autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == 'equal':
            diff.kept += b1 - b0
            continue
        paired = min(a1 - a0, b1 - b0) if tag == 'replace' else 0
        for offset, view in enumerate(current[b0:b1]):
            view.change = 'changed' if offset < paired else 'added'
        diff.changed += paired
        diff.added += (b1 - b0) - paired
        diff.removed.extend(previous[a0 + paired : a1])
    return diff
