"""Stored values as table cells: plain text (never read as markup), a dash where there is nothing, a
status in its colour, and moments in UTC."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.table import Table
from rich.text import Text

__all__ = ('clip', 'dash', 'styled_status', 'titled_table', 'when')

_STATUS_STYLE = {'completed': 'green', 'failed': 'red', 'unfinished': 'yellow', 'waiting': 'cyan'}


def styled_status(status: str) -> Text:
    return Text(status, style=_STATUS_STYLE.get(status, ''))


def dash(value: object) -> Text:
    """A stored value as plain text (never read as markup), `-` when there is none."""
    return Text('-' if value is None or value == '' else str(value))


def titled_table(title: str | None) -> Table:
    """A table whose title, which may name a run, is shown as plain text."""
    return Table(title=None if title is None else Text(title, style='table.title'))


def when(moment: datetime) -> str:
    """A moment as `YYYY-MM-DD HH:MM:SS` in UTC."""
    return _when(moment)


def _when(moment: datetime) -> str:
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime('%Y-%m-%d %H:%M:%S')


def clip(text: str, limit: int = 200) -> str:
    """`text` without carriage returns, cut to `limit` characters (the last one an ellipsis)."""
    text = text.replace('\r', '')
    return text if len(text) <= limit else text[: limit - 1] + '…'
