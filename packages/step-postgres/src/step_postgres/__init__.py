"""step-postgres: PostgreSQL `StepStore` and `MediaStore` backends for stepcore."""

from __future__ import annotations

from .media import PostgresMediaStore
from .schema import DEFAULT_TABLE_PREFIX, SchemaVersionError, validate_table_prefix
from .store import PostgresStepStore

__all__ = (
    'DEFAULT_TABLE_PREFIX',
    'PostgresMediaStore',
    'PostgresStepStore',
    'SchemaVersionError',
    'validate_table_prefix',
)
