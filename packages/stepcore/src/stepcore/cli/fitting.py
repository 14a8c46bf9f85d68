"""Fitting a table to the terminal: the widest columns give way first, wrapping cells rather than cutting
them, and a table too wide for the terminal is laid out narrower (`fitted`)."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

__all__ = ('FOLD_FLOOR', 'Moment', 'Whole', 'add_column', 'cell_lines', 'fit', 'fitted', 'natural_width', 'time_column')

FOLD_FLOOR = 12
"""The narrowest a column of ids (folded over several lines) is made when a table is fitted to a terminal."""

_WRAP_FLOOR = 4
"""The narrowest any wrapping column is made when a table cannot fit with every column at its floor."""

_measurer: Console | None = None


def _measuring_console() -> Console:
    global _measurer
    if _measurer is None:
        _measurer = Console(file=io.StringIO(), width=100_000, color_system=None, force_terminal=False)
    return _measurer


def _measure(table: Table, column: Column) -> tuple[int, int]:
    """A column's longest word and longest line, header included (content only, no padding)."""
    console = _measuring_console()
    cells: list[RenderableType] = list(column.cells)
    if table.show_header:
        cells.append(column.header)
    words, lines = 1, 1
    for cell in cells:
        measured = Measurement.get(console, console.options, cell)
        words, lines = max(words, measured.minimum), max(lines, measured.maximum)
    return words, lines


def _overhead(table: Table) -> int:
    """The characters a table's borders and cell padding take on each line."""
    count = len(table.columns)
    _, right, _, left = table.padding
    padding = count * (left + right)
    if not table.pad_edge and count:
        padding -= left + right
    if table.collapse_padding and count > 1:
        padding -= (count - 1) * min(left, right)
    borders = 0
    if table.box is not None:
        borders = count - 1 + (2 if table.show_edge else 0)
    return padding + borders


def natural_width(table: Table) -> int:
    """How wide `table` is when none of its cells wraps."""
    return sum(_measure(table, column)[1] for column in table.columns) + _overhead(table)


class Moment(Column):
    """A column of `YYYY-MM-DD HH:MM:SS` moments: on one line when there is room, else date above time."""


class Whole(Column):
    """A column of names a person reads (an agent, an event kind): its words are folded last of all."""


_DATE = 10
"""The width of a moment's date, the narrowest a column of moments is made."""


def add_column(table: Table, column: Column) -> None:
    """Add `column` (a `Moment`, a `Whole` or any `Column`) to `table`, as `Table.add_column` adds its own."""
    column._index = len(table.columns)  # pyright: ignore[reportPrivateUsage]
    table.columns.append(column)


def _floor(column: Column, word: int, line: int) -> int:
    """The narrowest `column` is made while every column keeps its words whole or its ids folded."""
    if column.width is not None:
        return column.width
    if column.no_wrap:
        return line
    if isinstance(column, Moment):
        return min(line, _DATE)
    if isinstance(column, Whole):
        return word
    if column.overflow == 'fold':
        return min(word, FOLD_FLOOR)
    return word


def _shrink(widths: list[int], floors: Sequence[int], excess: int) -> int:
    """Take `excess` characters from the widest columns first, none below its floor; what is left."""
    while excess > 0:
        room = [i for i, width in enumerate(widths) if width > floors[i]]
        if not room:
            break
        widest = max(room, key=lambda i: (widths[i], widths[i] - floors[i]))
        widths[widest] -= 1
        excess -= 1
    return excess


def fit(table: Table, width: int) -> Table:
    """Give `table`'s columns widths that fit in `width` characters, wrapping cells rather than cutting them.

    A table that fits is left as it is. Otherwise the widest columns give way first, each down to its
    longest word at most (a column of ids, folded over lines, down to `FOLD_FLOOR`; one that never
    wraps, such as a status word, not at all), so no cell loses words while the terminal has room for
    them; only a terminal too narrow for that cuts cells short.
    """
    columns = table.columns
    if not columns:
        return table
    measured = [_measure(table, column) for column in columns]
    widths = [
        column.width if column.width is not None else line for column, (_, line) in zip(columns, measured, strict=True)
    ]
    excess = sum(widths) + _overhead(table) - width
    if excess <= 0:
        return table
    floors = [_floor(column, word, line) for column, (word, line) in zip(columns, measured, strict=True)]
    # Words stay whole while they can: ids fold only once the other columns are down to their longest
    # words. Moments keep to one line till then too; past that, each goes to two lines at once.
    whole = [
        line if isinstance(column, Moment) else max(floor, word)
        for column, floor, (word, line) in zip(columns, floors, measured, strict=True)
    ]
    if sum(whole) + _overhead(table) > width:
        for index, column in enumerate(columns):
            if isinstance(column, Moment):
                widths[index] = whole[index] = floors[index]
        excess = sum(widths) + _overhead(table) - width
    excess = _shrink(widths, whole, excess)
    excess = _shrink(widths, floors, excess)
    if excess > 0:  # too narrow for every word: wrapping columns go further, to a few characters
        excess = _shrink(
            widths, [f if c.no_wrap else min(f, _WRAP_FLOOR) for c, f in zip(columns, floors, strict=True)], excess
        )
    if excess > 0:
        _shrink(widths, [1] * len(widths), excess)
    for column, new in zip(columns, widths, strict=True):
        column.width = new
    return table


def fitted(wide: Table, compact: Callable[[], Table], width: int | None) -> Table:
    """`wide` when it fits in `width` (or no width is given), else `compact()` fitted to it."""
    if width is None or natural_width(wide) <= width:
        return wide
    return fit(compact(), width)


def cell_lines(first: str, *labelled: tuple[str, object], style: str = '') -> Text:
    """A cell of several lines: `first`, then `label value` for each value there is (labels dim)."""
    text = Text(first, style=style)
    for label, value in labelled:
        if value is None or value == '':
            continue
        text.append(f'\n{label} ', style='dim')
        text.append(str(value))
    return text


def time_column(table: Table, header: str) -> None:
    """A column of `YYYY-MM-DD HH:MM:SS` moments: on one line when there is room, else date above time."""
    add_column(table, Moment(header))
