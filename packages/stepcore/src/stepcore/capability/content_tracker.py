"""`ContentTracker`: whether a history differs from the one a run saved last."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_ai.messages import ModelMessage

from stepcore.engine import TAIL_RECHECK, trusted_prefix
from stepcore.store.codec import encode_message

__all__ = ('ContentTracker',)


class ContentTracker:
    """The content of the newest saved history.

    Keeps the saved message objects and the encodings of the newest `stepcore.engine.TAIL_RECHECK` of them,
    which pydantic-ai stamps in place after a save. Older positions are compared by identity, and
    only where another object sits there by encoding both: messages older than the tail are never
    changed in place, so encoding them later gives what encoding them at save time would have.
    """

    def __init__(self) -> None:
        self.messages: list[ModelMessage] = []
        self.tail: list[bytes] | None = []
        """`None` when the tail was not encoded at save time: it then counts as changed."""
        self.saved = False

    def differs(self, messages: Sequence[ModelMessage]) -> bool:
        """True when `messages` is not the saved history (by content)."""
        if not self.saved or len(messages) != len(self.messages):
            return True
        boundary = len(messages) - min(len(messages), TAIL_RECHECK)
        for i in range(trusted_prefix(messages, self.messages), boundary):
            old, new = self.messages[i], messages[i]
            if old is not new and encode_message(old) != encode_message(new):
                return True
        return self.tail is None or [encode_message(m) for m in messages[boundary:]] != self.tail

    def same_objects(self, messages: Sequence[ModelMessage]) -> bool:
        """True when `messages` holds exactly the saved message objects (maybe stamped since)."""
        return (
            self.saved
            and len(messages) == len(self.messages)
            and all(a is b for a, b in zip(messages, self.messages, strict=True))
        )

    def update(self, messages: Sequence[ModelMessage], *, encode_tail: bool = True) -> None:
        """Remember `messages` as saved; without `encode_tail` a later `differs` on them says True.

        The tail is left unencoded for a tool cycle's snapshot that travels with the next
        request: the next boundary replaces it before anything compares against it.
        """
        # The saved lists are new ones nobody changes (`snapshot_points`): kept, not copied.
        self.messages = messages if isinstance(messages, list) else list(messages)
        self.tail = [encode_message(m) for m in self.messages[-TAIL_RECHECK:]] if encode_tail else None
        self.saved = True
