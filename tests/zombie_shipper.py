"""The shipping agent of the fenced-reconcile test, and the order system its tool writes to.

`python zombie_shipper.py '<config json>'` runs the agent once in this process (the process the test
freezes). Its tool `ship` hands the run's fencing token to the order system, which refuses a token
older than the newest it saw for the run's chain and otherwise adds an order row every time it is
asked (it does not deduplicate: deciding whether an order exists is the reconcile function's job).
Before it ships, the tool says so in the `ready` file and waits for the `thawed` file: the test
freezes the process there, before its write, and lets it go on when it chooses.

`find_order` is the tool's recovery policy, written as docs/recovery-policies.md says: fence, then
look, then (by returning `None`) let the call run again.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import stepcore
from stepcore import Reconciled, StepPersistence, StepStore, ToolEffectRecord, fencing_token, recovery_policy


class Refused(Exception):
    """The order system refused a token older than one it saw for the same chain of runs."""


class Orders:
    """The order system: a SQLite file outside the step store."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.executescript(
                """
                CREATE TABLE IF NOT EXISTS fences (origin TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS orders (item TEXT NOT NULL, origin TEXT NOT NULL,
                                                   epoch INTEGER NOT NULL, pid INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS refusals (origin TEXT NOT NULL, epoch INTEGER NOT NULL,
                                                     newest INTEGER NOT NULL, pid INTEGER NOT NULL);
                """
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30.0, isolation_level=None)

    def _fence(self, db: sqlite3.Connection, origin: str, epoch: int) -> None:
        """Raise the chain's fence to `epoch`, or refuse an older one (inside the caller's transaction)."""
        row = db.execute('SELECT epoch FROM fences WHERE origin = ?', (origin,)).fetchone()
        if row is not None and epoch < row[0]:
            db.execute('INSERT INTO refusals VALUES (?, ?, ?, ?)', (origin, epoch, row[0], os.getpid()))
            db.execute('COMMIT')
            raise Refused(f'order system refused epoch {epoch} of {origin!r}: it saw epoch {row[0]}')
        db.execute(
            'INSERT INTO fences VALUES (?, ?) ON CONFLICT (origin) DO UPDATE SET epoch = max(epoch, excluded.epoch)',
            (origin, epoch),
        )

    def raise_fence(self, origin: str, epoch: int) -> None:
        db = self._connect()
        try:
            db.execute('BEGIN IMMEDIATE')
            self._fence(db, origin, epoch)
            db.execute('COMMIT')
        finally:
            db.close()

    def ship(self, item: str, origin: str, epoch: int) -> None:
        """Check the token and add the order, in one transaction."""
        db = self._connect()
        try:
            db.execute('BEGIN IMMEDIATE')
            self._fence(db, origin, epoch)
            db.execute('INSERT INTO orders VALUES (?, ?, ?, ?)', (item, origin, epoch, os.getpid()))
            db.execute('COMMIT')
        finally:
            db.close()

    def find(self, item: str, origin: str) -> bool:
        with self._connect() as db:
            return (
                db.execute('SELECT 1 FROM orders WHERE item = ? AND origin = ?', (item, origin)).fetchone() is not None
            )

    def rows(self) -> list[tuple[str, str, int, int]]:
        with self._connect() as db:
            return [tuple(r) for r in db.execute('SELECT item, origin, epoch, pid FROM orders')]  # type: ignore[misc]

    def refusals(self) -> list[tuple[str, int, int, int]]:
        with self._connect() as db:
            return [tuple(r) for r in db.execute('SELECT origin, epoch, newest, pid FROM refusals')]  # type: ignore[misc]


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = {p.tool_call_id for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if 'ship-1' in returned:
        return ModelResponse(parts=[TextPart('shipped')])
    return ModelResponse(parts=[ToolCallPart('ship', {'item': 'teapot'}, tool_call_id='ship-1')])


def find_order_in(orders: Orders) -> Callable[[ToolEffectRecord], Reconciled | None]:
    """`ship`'s recovery policy: fence the order system with the claimer's token, then look."""

    def find_order(entry: ToolEffectRecord) -> Reconciled | None:
        token = fencing_token()
        assert token is not None, "a settlement under a claim has the claimer's fencing token"
        orders.raise_fence(token.origin, token.epoch)  # fence first: a zombie's write is refused from now on
        if orders.find(entry.args['item'], token.origin):  # then look
            return Reconciled('shipped (found on recovery)')
        return None  # not shipped: the call runs again, under the resumption's own token

    return find_order


def build_agent(store: StepStore, world: Path, *, ttl: float, run_id: str | None = None) -> Agent[None, str]:
    orders = Orders(world / 'orders.db')
    agent = Agent(
        FunctionModel(_model), name='shipper', capabilities=[StepPersistence(store=store, run_id=run_id, lease_ttl=ttl)]
    )

    @agent.tool_plain
    @recovery_policy(find_order_in(orders))
    def ship(item: str) -> str:  # pyright: ignore[reportUnusedFunction]
        token = fencing_token()
        assert token is not None
        (world / f'ready-{os.getpid()}').write_text(str(token.epoch))
        while not (world / 'thawed').exists():
            time.sleep(0.01)
        try:
            orders.ship(item, token.origin, token.epoch)
        except Refused as error:
            (world / f'attempted-{os.getpid()}').write_text(f'refused: {error}')
            raise
        (world / f'attempted-{os.getpid()}').write_text(f'shipped at epoch {token.epoch}')
        return f'shipped {item}'

    return agent


def main(config: dict[str, Any]) -> None:
    async def run() -> None:
        store = stepcore.from_spec(**config['spec'])
        try:
            agent = build_agent(store, Path(config['world']), ttl=config['ttl'], run_id=config['run_id'])
            await agent.run('ship a teapot')
        finally:
            await store.aclose()

    asyncio.run(run())


if __name__ == '__main__':
    main(json.loads(sys.argv[1]))
