"""step-sqlite: the embedded SQLite `StepStore` and `MediaStore` for stepcore."""

from __future__ import annotations

from .conversations import (
    ConversationConflict,
    ConversationSummary,
    GitCheckout,
    SavedConversation,
    SqliteConversationStore,
    conversation_text,
    ensure_inactive,
)
from .media import SqliteMediaStore
from .store import SqliteStepStore

__all__ = (
    'ConversationConflict',
    'ConversationSummary',
    'GitCheckout',
    'SavedConversation',
    'SqliteConversationStore',
    'SqliteMediaStore',
    'SqliteStepStore',
    'conversation_text',
    'ensure_inactive',
)

__version__ = '0.1.0'
