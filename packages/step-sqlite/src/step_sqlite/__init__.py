"""step-sqlite: the embedded SQLite `StepStore` and `MediaStore` for stepcore."""

from __future__ import annotations

from .conversations import ConversationConflict, ConversationSummary, SavedConversation, SqliteConversationStore
from .media import SqliteMediaStore
from .store import SqliteStepStore

__all__ = (
    'ConversationConflict',
    'ConversationSummary',
    'SavedConversation',
    'SqliteConversationStore',
    'SqliteMediaStore',
    'SqliteStepStore',
)

__version__ = '0.1.0'
