"""Small pieces of SQL that more than one SQL port needs, written once."""

from __future__ import annotations

from typing import LiteralString

from stepcore.engine._ops import ListEvents

__all__ = ('event_window',)


def event_window(op: ListEvents, select: LiteralString, mark: LiteralString) -> tuple[LiteralString, list[object]]:
    """The statement answering `op` from `select` (a `SELECT ... FROM <events> WHERE run_id = <mark>`
    whose columns include `seq`), and its parameters after the run id; `mark` is the driver's
    parameter marker (`?` or `%s`)."""
    query = select
    params: list[object] = []
    if op.after_seq is not None:
        query += f' AND seq > {mark}'
        params.append(op.after_seq)
    if op.limit is None:
        return query + ' ORDER BY seq', params
    params.append(op.limit)
    if op.newest:
        return f'SELECT * FROM ({query} ORDER BY seq DESC LIMIT {mark}) AS newest ORDER BY seq', params
    return query + f' ORDER BY seq LIMIT {mark}', params
